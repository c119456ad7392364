// Ranks of a train.strategy allreduce job as processes of the built binary,
// placed as Open MPI places them (OMPI_COMM_WORLD_* through /usr/bin/env),
// meeting on loopback at a free port.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli_child.h"
#include "tests/net/free_ports.h"

namespace shardwild::clitest {

class AllreduceRanks {
 public:
  // Starts `size` ranks of `train CONFIG --json` with `extra` arguments;
  // rank r also gets per_rank[r] (if given).
  AllreduceRanks(int size, const std::string& config, const std::vector<std::string>& extra,
                 const std::vector<std::vector<std::string>>& per_rank = {}) {
    // Only rank 0 listens on its address (the rendezvous, base_port); Gloo's
    // sockets take ports of the kernel's choice.
    base_port_ = testing_ports::FreePorts(1).at(0);
    for (int r = 0; r < size; ++r) {
      std::vector<std::string> prefix = {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=" + std::to_string(r),
                                         "OMPI_COMM_WORLD_SIZE=" + std::to_string(size),
                                         "OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(size)};
      std::vector<std::string> args = {"train", config, "--json", "--set", "train.strategy=allreduce", "--set",
                                       "cluster.base_port=" + std::to_string(base_port_)};
      args.insert(args.end(), extra.begin(), extra.end());
      if (r < static_cast<int>(per_rank.size())) args.insert(args.end(), per_rank[r].begin(), per_rank[r].end());
      ranks_.push_back(std::make_unique<Child>(args, prefix));
    }
  }
  Child& rank(int r) { return *ranks_[r]; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int base_port() const { return base_port_; }

 private:
  int base_port_ = 0;
  std::vector<std::unique_ptr<Child>> ranks_;
};

}  // namespace shardwild::clitest

// Helpers shared by the tests that train on the real Fashion-MNIST files.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/config.h"

namespace shardwild::testdata {

// The config `make train` runs.
inline const std::string kDefaultConfig = SHARDWILD_SOURCE_DIR "/configs/fashion_mnist_mlp.yaml";

// Whether the IDX files the default config names are on this machine (either
// the ".gz" or the plain name of each).
inline bool HaveFashionMnist() {
  namespace fs = std::filesystem;
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  for (const char* prefix : {"train", "t10k"}) {
    for (const char* kind : {"-images-idx3-ubyte", "-labels-idx1-ubyte"}) {
      const std::string base = dir + prefix + kind;
      if (!fs::exists(base + ".gz") && !fs::exists(base)) return false;
    }
  }
  return true;
}

// Loads the config at `path` with `--set`-style overrides ("key=value").
inline absl::StatusOr<Config> LoadConfigWithSets(const std::string& path, const std::vector<std::string>& sets) {
  std::vector<ConfigOverride> overrides;
  for (const std::string& s : sets) {
    absl::StatusOr<ConfigOverride> o = ParseOverride(s);
    if (!o.ok()) return o.status();
    overrides.push_back(*o);
  }
  return LoadConfig(path, overrides);
}

// The default config with `--set`-style overrides.
inline absl::StatusOr<Config> LoadDefaultConfig(const std::vector<std::string>& sets) {
  return LoadConfigWithSets(kDefaultConfig, sets);
}

// A scratch directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/shardwild-test-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Steps one epoch of task training takes (ps.update hogwild and row_lock,
// workers/task_trainer.h): the dispatcher's tasks of `records_per_task`
// records (the last one shorter), each in ceil(task records / batch) steps,
// whatever the number of workers.
inline int64_t TaskStepsPerEpoch(int64_t records, int64_t records_per_task, int64_t batch) {
  const int64_t full = records / records_per_task, rest = records % records_per_task;
  return full * ((records_per_task + batch - 1) / batch) + (rest + batch - 1) / batch;
}

}  // namespace shardwild::testdata

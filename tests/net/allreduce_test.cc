// Collective (net/allreduce.h): ranks as threads of this process, each with
// its own Gloo mesh over loopback TCP, meeting at rank 0's rendezvous.
#include "net/allreduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "free_ports.h"

namespace shardwild {
namespace {

using ::testing::HasSubstr;
using testing_ports::FreePorts;

CollectiveOptions Options(int rank, int size, int port, double timeout_s = 20,
                          AllreduceAlgorithm algorithm = AllreduceAlgorithm::kHalvingDoubling) {
  CollectiveOptions o;
  o.algorithm = algorithm;
  o.rank = rank;
  o.size = size;
  o.server.bind_address = absl::StrCat("127.0.0.1:", port);
  o.server.task_name = "rendezvous";
  o.rendezvous.address = absl::StrCat("127.0.0.1:", port);
  o.rendezvous.task_name = "rendezvous";
  o.rendezvous.deadline_s = timeout_s;
  o.gloo_host = "127.0.0.1";
  o.timeout_s = timeout_s;
  return o;
}

// Runs body(rank, collective) on `size` threads, each connected.
void OnRanks(int size, const std::function<void(int, Collective&)>& body, double timeout_s = 20,
             AllreduceAlgorithm algorithm = AllreduceAlgorithm::kHalvingDoubling) {
  const int port = FreePorts(1)[0];
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(r, size, port, timeout_s, algorithm));
      ASSERT_TRUE(c.ok()) << c.status();
      body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

class CollectiveAlgorithms : public ::testing::TestWithParam<AllreduceAlgorithm> {};

TEST_P(CollectiveAlgorithms, AllreduceSumsBitIdenticallyOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t kN = 100003;  // not a multiple of the ring's chunking
  std::vector<std::vector<float>> out(kRanks);
  OnRanks(kRanks, [&](int r, Collective& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), kRanks);
    std::vector<float> data(kN);
    for (size_t i = 0; i < kN; ++i) data[i] = 0.1f * static_cast<float>((i * 7 + r * 13) % 101) - 3.0f + 1e-3f * r;
    for (int round = 0; round < 3; ++round) ASSERT_TRUE(c.AllreduceSum(data.data(), kN).ok());
    out[r] = data;
    int64_t counts[2] = {r + 1, 10 * r};
    ASSERT_TRUE(c.AllreduceSum(counts, 2).ok());
    EXPECT_EQ(counts[0], 6);
    EXPECT_EQ(counts[1], 30);
    EXPECT_EQ(c.calls(), 3u);
    EXPECT_EQ(c.payload_bytes(), 3 * kN * sizeof(float));
  }, 20, GetParam());
  for (int r = 1; r < kRanks; ++r) {
    ASSERT_EQ(out[r].size(), kN);
    EXPECT_EQ(0, std::memcmp(out[r].data(), out[0].data(), kN * sizeof(float))) << "rank " << r;
  }
  // Three rounds of summing over 3 ranks: about 9 x the mean input, in double.
  for (size_t i = 0; i < kN; i += 9973) {
    double x = 0;
    for (int r = 0; r < kRanks; ++r) x += 0.1f * static_cast<float>((i * 7 + r * 13) % 101) - 3.0f + 1e-3f * r;
    EXPECT_NEAR(out[0][i], 9.0 * x, 1e-3 * (1 + std::abs(9.0 * x))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(HalvingDoublingAndRing, CollectiveAlgorithms,
                         ::testing::Values(AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kRing));

TEST(Collective, BroadcastAllgatherAndCheckSame) {
  OnRanks(3, [&](int r, Collective& c) {
    std::vector<float> data(1000, static_cast<float>(r));
    ASSERT_TRUE(c.Broadcast(data.data(), data.size(), 1).ok());
    EXPECT_EQ(data[0], 1.0f);
    EXPECT_EQ(data[999], 1.0f);
    absl::StatusOr<std::vector<uint64_t>> all = c.Allgather(100 + r);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, (std::vector<uint64_t>{100, 101, 102}));
    EXPECT_TRUE(c.CheckSame(7, "the seven").ok());
    const absl::Status s = c.CheckSame(r == 2 ? 8 : 7, "the model layout");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("allreduce: the model layout of rank 2 differs from rank 0's"));
  });
}

TEST(Collective, AMissingRankIsADeadlineNotAHang) {
  const int port = FreePorts(1)[0];
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 of 2 never comes.
  absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(0, 2, port, 1.5));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("allreduce: connecting over 2 ranks failed on rank 0"));
  EXPECT_LT(waited, 30.0);
  // A rank whose rendezvous never answers gives up too.
  c = Collective::Connect(Options(1, 2, FreePorts(1)[0], 1.0));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("rendezvous at 127.0.0.1:"));
}

TEST(Collective, ALostRankFailsThePeersCollective) {
  const int port = FreePorts(1)[0];
  std::thread rank1([&] {
    absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(1, 2, port, 5));
    ASSERT_TRUE(c.ok()) << c.status();
    // Leaves without taking part: its sockets close.
  });
  absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(0, 2, port, 5));
  ASSERT_TRUE(c.ok()) << c.status();
  rank1.join();
  std::vector<float> data(1000, 1.0f);
  const absl::Status s = (*c)->AllreduceSum(data.data(), data.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("allreduce: allreduce over 2 ranks failed on rank 0"));
}

TEST(Collective, BadRanks) {
  EXPECT_EQ(Collective::Connect(Options(2, 2, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Collective::Connect(Options(-1, 2, 1)).status().message(),
              HasSubstr("rank -1 is outside the world of 2 ranks"));
}

TEST(Fingerprint, SeesEveryBit) {
  std::vector<float> a(64, 1.0f), b = a;
  EXPECT_EQ(Fingerprint(a.data(), a.size()), Fingerprint(b.data(), b.size()));
  b[63] = std::nextafter(1.0f, 2.0f);
  EXPECT_NE(Fingerprint(a.data(), a.size()), Fingerprint(b.data(), b.size()));
}

}  // namespace
}  // namespace shardwild

// The acceptance run of train.strategy allreduce: 3 ranks (processes of the
// built binary on loopback) train the default MLP for 20 epochs to the
// single-machine accuracy, with bit-identical parameters on every rank.
// About 2-3 minutes on 2 cores; labelled slow. Skips without Fashion-MNIST.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "allreduce_ranks.h"
#include "cli_child.h"

namespace shardwild::clitest {
namespace {

TEST(AllreduceAccuracy, ThreeRanksTwentyEpochsReachTheTarget) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  AllreduceRanks job(3, kConfig, {"--set", "train.epochs=20", "--set", "train.workers=1"});
  std::string fingerprint;
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err();
    const json j = LastLineJson(job.rank(r).out());
    ASSERT_TRUE(j.is_object()) << job.rank(r).out();
    EXPECT_EQ(j["records_seen"], 20 * 60000);
    EXPECT_GE(j["test_accuracy"].get<double>(), 0.885) << "rank " << r;
    if (r == 0) fingerprint = j["allreduce"]["params_fingerprint"];
    EXPECT_EQ(j["allreduce"]["params_fingerprint"], fingerprint) << "rank " << r;
    std::printf("rank %d: test accuracy %.4f, %.0f samples/s, %.1f s\n", r, j["test_accuracy"].get<double>(),
                j["samples_per_s"].get<double>(), j["wall_s"].get<double>());
  }
}

}  // namespace
}  // namespace shardwild::clitest

// Acceptance runs of the shipped sparse configs (ctest label `slow`): as
// they are, on generated data of realistic size, only the data paths set.
// ctr_dlrm.yaml must come within 0.02 AUC of the planted model's Bayes AUC,
// text_bow.yaml within 2 points of its Bayes accuracy; sparse_logreg.yaml
// and ctr_wide_deep.yaml are held to 0.02 AUC as well.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/workers/sparse_test_util.h"
#include "tests/workers/test_config.h"

namespace shardwild {
namespace {

using testdata::Generate;
using testdata::Load;
using testdata::Metric;
using testdata::TempDir;
using testdata::Train;

TEST(SparseAcceptanceTest, CtrDlrmReachesBayesAuc) {
  TempDir dir;
  Generate("criteo", 300000, 1, dir.path() + "/train.tsv");
  const double bayes = Generate("criteo", 50000, 2, dir.path() + "/test.tsv");
  absl::StatusOr<Config> config = Load("ctr_dlrm.yaml", {absl::StrCat("data.train=", dir.path(), "/train.tsv"),
                                                         absl::StrCat("data.test=", dir.path(), "/test.tsv")});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainSummary> s = Train(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  const double auc = Metric(*s, "test_auc");
  std::printf("ctr_dlrm: test AUC %.4f, Bayes AUC %.4f, %.0f samples/s\n", auc, bayes, s->samples_per_s);
  EXPECT_GE(auc, bayes - 0.02);
}

TEST(SparseAcceptanceTest, TextBowReachesBayesAccuracy) {
  TempDir dir;
  Generate("text", 100000, 1, dir.path() + "/train.txt");
  const double bayes = Generate("text", 20000, 2, dir.path() + "/test.txt");
  absl::StatusOr<Config> config = Load("text_bow.yaml", {absl::StrCat("data.train=", dir.path(), "/train.txt"),
                                                         absl::StrCat("data.test=", dir.path(), "/test.txt")});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainSummary> s = Train(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  std::printf("text_bow: test accuracy %.4f, Bayes accuracy %.4f\n", *s->test_accuracy, bayes);
  EXPECT_GE(*s->test_accuracy, bayes - 0.02);
}

TEST(SparseAcceptanceTest, SparseLogregReachesBayesAuc) {
  TempDir dir;
  Generate("libsvm", 200000, 1, dir.path() + "/train.txt");
  const double bayes = Generate("libsvm", 50000, 2, dir.path() + "/test.txt");
  absl::StatusOr<Config> config = Load("sparse_logreg.yaml", {absl::StrCat("data.train=", dir.path(), "/train.txt"),
                                                              absl::StrCat("data.test=", dir.path(), "/test.txt")});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainSummary> s = Train(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  const double auc = Metric(*s, "test_auc");
  std::printf("sparse_logreg: test AUC %.4f, Bayes AUC %.4f\n", auc, bayes);
  EXPECT_GE(auc, bayes - 0.02);
}

TEST(SparseAcceptanceTest, WideDeepReachesBayesAuc) {
  TempDir dir;
  Generate("criteo", 300000, 1, dir.path() + "/train.tsv");
  const double bayes = Generate("criteo", 50000, 2, dir.path() + "/test.tsv");
  absl::StatusOr<Config> config = Load("ctr_wide_deep.yaml", {absl::StrCat("data.train=", dir.path(), "/train.tsv"),
                                                              absl::StrCat("data.test=", dir.path(), "/test.tsv")});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainSummary> s = Train(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  const double auc = Metric(*s, "test_auc");
  std::printf("ctr_wide_deep: test AUC %.4f, Bayes AUC %.4f\n", auc, bayes);
  EXPECT_GE(auc, bayes - 0.02);
}

}  // namespace
}  // namespace shardwild

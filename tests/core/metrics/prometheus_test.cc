#include "core/metrics/prometheus.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/core/metrics/prometheus_text_parser.h"

namespace shardwild {
namespace {

MetricFamily Simple(std::string name, MetricType type, std::string help, double v) {
  return MetricFamily{std::move(name), type, std::move(help), {MetricSeries{{}, [v] { return v; }}}};
}

TEST(PrometheusTest, FormatsValues) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(12345), "12345");
  EXPECT_EQ(FormatMetricValue(-7), "-7");
  EXPECT_EQ(FormatMetricValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatMetricValue(1e20), "1e+20");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(FormatMetricValue(1.5e-9), "1.5e-09");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  // Every finite value reads back as itself.
  for (double v : {0.1, 1.0 / 3.0, 6.02214076e23, -2.5e-300, 123456.789}) {
    EXPECT_EQ(std::stod(FormatMetricValue(v)), v) << FormatMetricValue(v);
  }
}

TEST(PrometheusTest, Escapes) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeHelpText("say \"hi\"\\\n"), "say \"hi\"\\\\\\n");  // quotes stay as they are in HELP
}

TEST(PrometheusTest, Names) {
  for (const char* ok : {"a", "_x", ":y", "shardwild_samples_total", "a:b_c9"}) EXPECT_TRUE(IsValidMetricName(ok)) << ok;
  for (const char* bad : {"", "9a", "a-b", "a b", "a.b", "ä"}) EXPECT_FALSE(IsValidMetricName(bad)) << bad;
  for (const char* ok : {"phase", "_k", "k9"}) EXPECT_TRUE(IsValidLabelName(ok)) << ok;
  for (const char* bad : {"", "9k", "a:b", "__name__", "a-b"}) EXPECT_FALSE(IsValidLabelName(bad)) << bad;
}

TEST(PrometheusTest, RendersExactly) {
  MetricRegistry r;
  ASSERT_TRUE(r.Add(Simple("shardwild_samples_total", MetricType::kCounter, "Records seen.", 1234)).ok());
  MetricFamily phases{"shardwild_step_phase_seconds_total", MetricType::kCounter, "Seconds per phase.", {}};
  phases.series.push_back(MetricSeries{{{"phase", "data"}}, [] { return 0.5; }});
  phases.series.push_back(MetricSeries{{{"phase", "forward"}}, [] { return 2.0; }});
  ASSERT_TRUE(r.Add(std::move(phases)).ok());
  ASSERT_TRUE(r.Add(Simple("shardwild_train_loss", MetricType::kGauge, "Loss; NaN\nbefore \\ the first.",
                           std::numeric_limits<double>::quiet_NaN()))
                  .ok());
  MetricFamily odd{"odd", MetricType::kGauge, "Odd labels.", {}};
  odd.series.push_back(MetricSeries{{{"path", "C:\\tmp\\\"x\"\n"}, {"b", ""}}, [] { return -INFINITY; }});
  odd.series.push_back(MetricSeries{{{"path", "y"}, {"b", ""}}, [] { return INFINITY; }});
  ASSERT_TRUE(r.Add(std::move(odd)).ok());
  const std::string text = r.Render();
  EXPECT_EQ(text,
            "# HELP shardwild_samples_total Records seen.\n"
            "# TYPE shardwild_samples_total counter\n"
            "shardwild_samples_total 1234\n"
            "# HELP shardwild_step_phase_seconds_total Seconds per phase.\n"
            "# TYPE shardwild_step_phase_seconds_total counter\n"
            "shardwild_step_phase_seconds_total{phase=\"data\"} 0.5\n"
            "shardwild_step_phase_seconds_total{phase=\"forward\"} 2\n"
            "# HELP shardwild_train_loss Loss; NaN\\nbefore \\\\ the first.\n"
            "# TYPE shardwild_train_loss gauge\n"
            "shardwild_train_loss NaN\n"
            "# HELP odd Odd labels.\n"
            "# TYPE odd gauge\n"
            "odd{path=\"C:\\\\tmp\\\\\\\"x\\\"\\n\",b=\"\"} -Inf\n"
            "odd{path=\"y\",b=\"\"} +Inf\n");

  // The strict parser reads it back: values, labels and help unescaped.
  const prometheus_text::Parsed p = prometheus_text::Parse(text);
  ASSERT_TRUE(p.ok()) << p.error;
  EXPECT_EQ(p.families.at("shardwild_samples_total").type, "counter");
  EXPECT_EQ(p.Value("shardwild_samples_total"), 1234);
  EXPECT_EQ(p.Value("shardwild_step_phase_seconds_total", {{"phase", "data"}}), 0.5);
  EXPECT_TRUE(std::isnan(p.Value("shardwild_train_loss")));
  EXPECT_EQ(p.families.at("shardwild_train_loss").help, "Loss; NaN\nbefore \\ the first.");
  EXPECT_EQ(p.Value("odd", {{"path", "C:\\tmp\\\"x\"\n"}, {"b", ""}}), -INFINITY);
  EXPECT_EQ(p.Value("odd", {{"path", "y"}, {"b", ""}}), INFINITY);
}

TEST(PrometheusTest, ValuesAreReadAtRender) {
  MetricRegistry r;
  double v = 1;
  ASSERT_TRUE(r.Add(MetricFamily{"g", MetricType::kGauge, "G.", {MetricSeries{{}, [&v] { return v; }}}}).ok());
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng 1\n");
  v = 2.5;
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng 2.5\n");
}

TEST(PrometheusTest, RejectsBadFamilies) {
  MetricRegistry r;
  ASSERT_TRUE(r.Add(Simple("a", MetricType::kGauge, "A.", 1)).ok());
  const absl::Status dup = r.Add(Simple("a", MetricType::kCounter, "A again.", 1));
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dup.message(), "metric a: is already registered");
  EXPECT_FALSE(r.Add(Simple("b-c", MetricType::kGauge, "", 1)).ok());
  EXPECT_FALSE(r.Add(MetricFamily{"empty", MetricType::kGauge, "", {}}).ok());
  EXPECT_FALSE(r.Add(MetricFamily{"nocb", MetricType::kGauge, "", {MetricSeries{{}, nullptr}}}).ok());
  auto one = [] { return 1.0; };
  EXPECT_FALSE(r.Add(MetricFamily{"badlabel", MetricType::kGauge, "", {MetricSeries{{{"__x", "v"}}, one}}}).ok());
  EXPECT_FALSE(
      r.Add(MetricFamily{"replabel", MetricType::kGauge, "", {MetricSeries{{{"k", "1"}, {"k", "2"}}, one}}}).ok());
  const absl::Status same = r.Add(MetricFamily{
      "same",
      MetricType::kGauge,
      "",
      {MetricSeries{{{"x", "1"}, {"y", "2"}}, one}, MetricSeries{{{"y", "2"}, {"x", "1"}}, one}}});
  EXPECT_EQ(same.message(), "metric same: two series have the same labels");
  // Nothing of the rejected ones was added.
  EXPECT_EQ(r.Render(), "# HELP a A.\n# TYPE a gauge\na 1\n");
}

TEST(PrometheusTest, RenderIsThreadSafe) {
  MetricRegistry r;
  ASSERT_TRUE(r.Add(Simple("first", MetricType::kGauge, "F.", 1)).ok());
  std::thread adder([&r] {
    for (int i = 0; i < 50; ++i) EXPECT_TRUE(r.Add(Simple(absl::StrCat("m", i), MetricType::kGauge, "M.", i)).ok());
  });
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(prometheus_text::Parse(r.Render()).ok());
  adder.join();
  EXPECT_EQ(prometheus_text::Parse(r.Render()).families.size(), 51u);
}

// The test parser is strict: it rejects what Prometheus would, and what our
// output must never contain.
TEST(PrometheusTextParserTest, IsStrict) {
  using prometheus_text::Parse;
  const std::string head = "# HELP a A.\n# TYPE a gauge\n";
  EXPECT_TRUE(Parse(head + "a 1\n").ok());
  EXPECT_TRUE(Parse(head + "a{k=\"v\",l=\"w\"} -1.5e3 1700000000000\n").ok());
  EXPECT_FALSE(Parse(head + "a 1").ok()) << "no final line feed";
  EXPECT_FALSE(Parse("a 1\n").ok()) << "no HELP/TYPE";
  EXPECT_FALSE(Parse("# TYPE a gauge\na 1\n").ok()) << "no HELP";
  EXPECT_FALSE(Parse("# HELP a A.\na 1\n# TYPE a gauge\n").ok()) << "TYPE after samples";
  EXPECT_FALSE(Parse(head + "a 1\na 2\n").ok()) << "duplicate series";
  EXPECT_FALSE(Parse(head + "a{k=\"v\",} 1\n").ok()) << "trailing comma";
  EXPECT_FALSE(Parse(head + "a{k=v} 1\n").ok()) << "unquoted value";
  EXPECT_FALSE(Parse(head + "a{k=\"\\t\"} 1\n").ok()) << "bad escape";
  EXPECT_FALSE(Parse(head + "a{9k=\"v\"} 1\n").ok()) << "bad label name";
  EXPECT_FALSE(Parse(head + "a{k=\"v\",k=\"w\"} 1\n").ok()) << "repeated label";
  EXPECT_FALSE(Parse(head + "a one\n").ok()) << "bad value";
  EXPECT_FALSE(Parse(head + "a  1\n").ok()) << "two spaces";
  EXPECT_FALSE(Parse(head + "\na 1\n").ok()) << "blank line";
  EXPECT_FALSE(Parse(head + "# other comment\na 1\n").ok());
  EXPECT_FALSE(Parse("# HELP a A.\n# TYPE a meter\na 1\n").ok()) << "unknown type";
  EXPECT_FALSE(Parse(head + "a 1\n# HELP b B.\n# TYPE b gauge\nb 1\na{k=\"x\"} 2\n").ok()) << "family split";
  EXPECT_FALSE(Parse("# HELP 1a A.\n# TYPE 1a gauge\n1a 1\n").ok()) << "bad metric name";
  EXPECT_FALSE(Parse("# HELP a bad \\q escape\n# TYPE a gauge\na 1\n").ok()) << "bad HELP escape";
}

}  // namespace
}  // namespace shardwild

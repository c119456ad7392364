// Live metrics (metrics.port) end to end: the built `shardwild` binary
// (SHARDWILD_BINARY) trains as a child process while the test scrapes
// http://127.0.0.1:PORT/metrics with httplib's client and parses every
// scrape strictly (tests/core/metrics/prometheus_text_parser.h). Also the
// errors (a port in use, bad metrics.* values), the ports of worker
// processes, and the sample Grafana dashboard against a real scrape. The
// tests that train skip without Fashion-MNIST.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_child.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"

namespace shardwild::clitest {
namespace {

using prometheus_text::Parsed;

#define SKIP_WITHOUT_DATA() \
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist"

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A long run (stopped by the tests with SIGTERM) on a little of the data, so
// that progress intervals and epochs come quickly even under a sanitizer.
std::vector<std::string> LongRun(int port, const std::string& job, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"train",
                                   kConfig,
                                   "--set", "metrics.port=" + std::to_string(port),
                                   "--set", "train.epochs=100000",
                                   "--set", "data.max_train_records=6000",
                                   "--set", "data.max_test_records=500",
                                   "--set", "eval.every_epochs=0",
                                   "--set", "train.log_every_s=0.1",
                                   "--set", "ps.job_name=" + job};
  for (const std::string& e : extra) args.insert(args.end(), {"--set", e});
  return args;
}

double Sum(const Parsed& p, const std::string& family) {
  double s = 0;
  for (const prometheus_text::Sample& x : p.families.at(family).samples) s += x.value;
  return s;
}

// SIGTERM (the run unlinks its shared memory and dies of the signal), then
// waits until `ports` are free again.
void Stop(Child& child, const std::vector<int>& ports) {
  if (child.running()) kill(child.pid(), SIGTERM);
  const int status = child.Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << child.err();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int port : ports) {
    while (!CanListen(port) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(CanListen(port)) << "port " << port << " still taken";
  }
}

// The metric names a PromQL expression uses.
std::set<std::string> MetricNamesIn(const std::string& expr) {
  static const std::regex name("shardwild_[a-zA-Z0-9_:]*");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator(); ++it) {
    names.insert(it->str());
  }
  return names;
}

// Every "expr" and variable query in a Grafana dashboard, recursively.
void CollectQueries(const json& j, std::vector<std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if ((it.key() == "expr" || it.key() == "definition") && it->is_string()) out->push_back(*it);
      if (it.key() == "query" && it->is_string()) out->push_back(*it);
      CollectQueries(*it, out);
    }
  } else if (j.is_array()) {
    for (const json& e : j) CollectQueries(e, out);
  }
}

// The acceptance test: two scrapes a second apart while `train` runs show
// shardwild_samples_total growing, with every family, parsed strictly; the
// sample dashboard only uses what the exporter serves.
TEST(MetricsCliTest, TrainServesLiveMetricsThatGrow) {
  SKIP_WITHOUT_DATA();
  const int port = FreePortRun(0);
  ASSERT_GT(port, 0);
  const std::string job = "swmetrics-live-" + std::to_string(getpid());
  Child child(LongRun(port, job));
  ASSERT_TRUE(child.started());
  const auto training = [](const Scrape& s) {
    return s.parsed.Value("shardwild_samples_total") > 0 && s.parsed.Value("shardwild_train_loss") > 0;
  };
  const std::optional<Scrape> first = ScrapeUntil(child, port, training, std::chrono::seconds(180));
  ASSERT_TRUE(first) << "no scrape with samples and a loss\n" << child.out() << child.err();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::optional<Scrape> second = ScrapeOnce(port);
  ASSERT_TRUE(second);
  for (const Scrape* s : {&*first, &*second}) {
    EXPECT_EQ(s->status, 200);
    EXPECT_EQ(s->content_type, "text/plain; version=0.0.4; charset=utf-8");
    ASSERT_TRUE(s->parsed.ok()) << s->parsed.error << "\n" << s->body;
    for (const std::string& family : ChiefFamilies()) {
      ASSERT_TRUE(s->parsed.families.count(family)) << family << " missing:\n" << s->body;
    }
  }
  const Parsed& a = first->parsed;
  const Parsed& b = second->parsed;
  EXPECT_GT(b.Value("shardwild_samples_total"), a.Value("shardwild_samples_total")) << second->body;
  EXPECT_GT(b.Value("shardwild_steps_total"), a.Value("shardwild_steps_total"));
  EXPECT_GT(Sum(b, "shardwild_step_phase_seconds_total"), Sum(a, "shardwild_step_phase_seconds_total"));
  EXPECT_GE(b.Value("shardwild_store_version"), a.Value("shardwild_store_version"));
  EXPECT_GT(b.Value("shardwild_store_version"), 0);
  // Types, labels and values.
  const std::map<std::string, std::string> types = {
      {"shardwild_samples_total", "counter"},        {"shardwild_steps_total", "counter"},
      {"shardwild_step_phase_seconds_total", "counter"}, {"shardwild_train_loss", "gauge"},
      {"shardwild_store_version", "gauge"},          {"shardwild_store_bytes", "gauge"},
      {"shardwild_tasks_requeued_total", "counter"}, {"shardwild_worker_failures_total", "counter"},
      {"shardwild_checkpoints_written_total", "counter"}, {"shardwild_job_records_total", "counter"},
      {"shardwild_info", "gauge"}};
  for (const auto& [family, type] : types) EXPECT_EQ(b.families.at(family).type, type) << family;
  std::set<std::string> phases;
  for (const prometheus_text::Sample& s : b.families.at("shardwild_step_phase_seconds_total").samples) {
    phases.insert(s.labels.at("phase"));
    EXPECT_GE(s.value, 0);
  }
  EXPECT_EQ(phases, (std::set<std::string>{"data", "read_params", "pull_rows", "forward", "backward", "push",
                                           "push_rows"}));
  EXPECT_GT(b.Value("shardwild_step_phase_seconds_total", {{"phase", "forward"}}), 0);
  EXPECT_GT(b.Value("shardwild_store_bytes", {{"kind", "params"}}), 0);
  EXPECT_GT(b.Value("shardwild_store_bytes", {{"kind", "slots"}}), 0);  // Adam: two slots per parameter
  EXPECT_EQ(b.Value("shardwild_tasks_requeued_total"), 0);
  EXPECT_EQ(b.Value("shardwild_worker_failures_total"), 0);
  EXPECT_EQ(b.families.at("shardwild_info").samples.at(0).labels.at("role"), "chief");
  EXPECT_TRUE(Has(child.out(), "live metrics: http://127.0.0.1:" + std::to_string(port) + "/metrics\n"))
      << child.out();

  // The sample Grafana dashboard: Grafana 9+ JSON whose queries use only
  // metrics this scrape served.
  std::ifstream in(SHARDWILD_SOURCE_DIR "/examples/grafana/shardwild.json");
  ASSERT_TRUE(in) << "examples/grafana/shardwild.json";
  const json dash = json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(dash.is_discarded()) << "the dashboard is not valid JSON";
  EXPECT_GE(dash.value("schemaVersion", 0), 36);  // Grafana 9
  bool datasource_variable = false;
  for (const json& v : dash.at("templating").at("list")) {
    datasource_variable |= v.value("type", "") == "datasource" && v.value("query", "") == "prometheus";
  }
  EXPECT_TRUE(datasource_variable) << "no Prometheus datasource variable";
  ASSERT_GE(dash.at("panels").size(), 8u);
  std::vector<std::string> queries;
  CollectQueries(dash, &queries);
  std::set<std::string> used;
  for (const std::string& q : queries) {
    const std::set<std::string> names = MetricNamesIn(q);
    used.insert(names.begin(), names.end());
  }
  for (const char* needed : {"shardwild_samples_total", "shardwild_steps_total", "shardwild_train_loss",
                             "shardwild_step_phase_seconds_total", "shardwild_store_version",
                             "shardwild_tasks_requeued_total", "shardwild_worker_failures_total",
                             "shardwild_checkpoints_written_total", "shardwild_store_bytes"}) {
    EXPECT_TRUE(used.count(needed)) << "the dashboard has no panel on " << needed;
  }
  for (const std::string& name : used) EXPECT_TRUE(b.families.count(name)) << "the dashboard uses " << name;
  for (const json& p : dash.at("panels")) {
    EXPECT_EQ(p.at("datasource").at("uid"), "${datasource}") << p.dump();
  }

  Stop(child, {port});
  EXPECT_TRUE(ShmEntriesContaining(job).empty()) << "shared memory left behind";
}

// A run to its end: the server stops and joins (exit 0), and the port is free.
TEST(MetricsCliTest, RunToTheEndExitsCleanly) {
  SKIP_WITHOUT_DATA();
  const int port = FreePortRun(0);
  ASSERT_GT(port, 0);
  Child child({"train", kConfig, "--set", "metrics.port=" + std::to_string(port), "--set", "train.epochs=1", "--set",
               "data.max_train_records=2000", "--set", "data.max_test_records=500", "--json"});
  const int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << child.err();
  EXPECT_TRUE(Has(child.out(), "live metrics: http://127.0.0.1:" + std::to_string(port) + "/metrics\n"));
  EXPECT_TRUE(json::parse(Lines(child.out()).back()).is_object());
  EXPECT_TRUE(CanListen(port));
}

// A port in use: one error line naming metrics.port, a non-zero exit, and
// no training (the server listens before the data loads; no data needed).
TEST(MetricsCliTest, PortInUseIsOneErrorLineBeforeTraining) {
  const int port = FreePortRun(0);
  ASSERT_GT(port, 0);
  BusyPort busy(port);
  ASSERT_TRUE(busy.ok());
  Child child({"train", kConfig, "--set", "metrics.port=" + std::to_string(port)});
  const int status = child.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_EQ(child.err(),
            "shardwild: error: metrics.port: cannot listen on 127.0.0.1:" + std::to_string(port) +
                ": address in use\n");
  EXPECT_EQ(child.out(), "");
}

TEST(MetricsCliTest, BadSettingsAreConfigErrorsNamingTheKey) {
  struct Case {
    std::string set, message;
  };
  const std::string cfg = kConfig;
  for (const Case& c : std::vector<Case>{
           {"metrics.port=70000", cfg + ": metrics.port: must be in [1, 65535], or 0 for off, got 70000"},
           {"metrics.port=-1", cfg + ": metrics.port: must be in [1, 65535], or 0 for off, got -1"},
           {"metrics.port=many", "--set metrics.port=many: metrics.port: expected an integer, got 'many'"},
           {"metrics.bind=localhost",
            cfg + ": metrics.bind: expected an IPv4 or IPv6 address such as 127.0.0.1, ::1 or 0.0.0.0, got "
                  "'localhost'"},
           {"metrics.bind=300.1.2.3",
            cfg + ": metrics.bind: expected an IPv4 or IPv6 address such as 127.0.0.1, ::1 or 0.0.0.0, got "
                  "'300.1.2.3'"},
       }) {
    Child child({"train", kConfig, "--set", c.set});
    const int status = child.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << c.set;
    EXPECT_EQ(child.err(), "shardwild: error: " + c.message + "\n") << c.set;
  }
  // An address this machine does not have: one line, before any training.
  const int port = FreePortRun(0);
  Child child({"train", kConfig, "--set", "metrics.port=" + std::to_string(port), "--set", "metrics.bind=192.0.2.1"});
  EXPECT_NE(child.Wait(), 0);
  EXPECT_EQ(child.err(), "shardwild: error: metrics.port: cannot listen on 192.0.2.1:" + std::to_string(port) +
                             ": address not available on this machine\n");
}

// train.worker_processes: worker process k serves metrics.port + 1 + k with
// its own worker's samples, steps and phases; the chief serves the rest.
TEST(MetricsCliTest, WorkerProcessesServeTheNextPorts) {
  SKIP_WITHOUT_DATA();
  const int port = FreePortRun(2);
  ASSERT_GT(port, 0);
  const std::string job = "swmetrics-procs-" + std::to_string(getpid());
  Child child(LongRun(port, job, {"train.worker_processes=true", "train.workers=2"}));
  const auto stepped = [](const Scrape& s) { return s.parsed.Value("shardwild_samples_total") > 0; };
  const std::set<std::string> worker_families = {"shardwild_samples_total", "shardwild_steps_total",
                                                 "shardwild_step_phase_seconds_total", "shardwild_info"};
  for (int k = 0; k < 2; ++k) {
    const std::optional<Scrape> s = ScrapeUntil(child, port + 1 + k, stepped, std::chrono::seconds(180));
    ASSERT_TRUE(s) << "worker process " << k << " served no steps\n" << child.out() << child.err();
    std::set<std::string> families;
    for (const auto& [name, f] : s->parsed.families) families.insert(name);
    EXPECT_EQ(families, worker_families) << s->body;
    EXPECT_EQ(s->parsed.families.at("shardwild_info").samples.at(0).labels.at("role"), "worker");
    EXPECT_GT(s->parsed.Value("shardwild_step_phase_seconds_total", {{"phase", "backward"}}), 0);
  }
  const std::optional<Scrape> chief =
      ScrapeUntil(child, port, [](const Scrape& s) { return s.parsed.Value("shardwild_store_version") > 0; },
                  std::chrono::seconds(60));
  ASSERT_TRUE(chief) << child.out() << child.err();
  for (const std::string& family : ChiefFamilies()) EXPECT_TRUE(chief->parsed.families.count(family)) << family;
  // Its own worker threads are idle: the worker processes count the steps,
  // and the chief the job's records, task by task.
  EXPECT_EQ(chief->parsed.Value("shardwild_samples_total"), 0);
  const std::optional<Scrape> progressed = ScrapeUntil(
      child, port, [](const Scrape& s) { return s.parsed.Value("shardwild_job_records_total") > 0; },
      std::chrono::seconds(60));
  ASSERT_TRUE(progressed) << "the chief counted no records of finished tasks\n" << child.out() << child.err();
  Stop(child, {port, port + 1, port + 2});  // the worker processes die with the chief
  EXPECT_TRUE(ShmEntriesContaining(job).empty()) << "shared memory left behind";
}

// A worker process whose port is taken fails the job's start with one line.
TEST(MetricsCliTest, WorkerProcessPortInUseFailsTheStart) {
  SKIP_WITHOUT_DATA();
  const int port = FreePortRun(2);
  ASSERT_GT(port, 0);
  BusyPort busy(port + 2);
  ASSERT_TRUE(busy.ok());
  Child child(LongRun(port, "swmetrics-busy-" + std::to_string(getpid()),
                      {"train.worker_processes=true", "train.workers=2", "train.restart_workers=false"}));
  const int status = child.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  const std::vector<std::string> lines = Lines(child.err());
  ASSERT_EQ(lines.size(), 1u) << child.err();
  EXPECT_TRUE(std::regex_match(
      lines[0], std::regex("shardwild: error: worker process 1 \\(pid [0-9]+\\) failed to start: metrics.port: cannot "
                           "listen on 127.0.0.1:" +
                           std::to_string(port + 2) + " for worker process 1 \\(metrics.port \\+ 2\\): address in use")))
      << lines[0];
  EXPECT_FALSE(Has(child.out(), "epoch 1/")) << child.out();
}

}  // namespace
}  // namespace shardwild::clitest

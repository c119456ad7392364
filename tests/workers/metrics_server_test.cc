// workers/metrics_server and workers/live_metrics: the HTTP endpoint on
// loopback (httplib's client), its errors, its shutdown, and what each
// role's LiveMetrics serves.
#include "workers/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "tests/core/metrics/prometheus_text_parser.h"
#include "workers/live_metrics.h"

namespace shardwild {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::unique_ptr<MetricRegistry> OneGauge(double v) {
  auto r = std::make_unique<MetricRegistry>();
  EXPECT_TRUE(r->Add(MetricFamily{"test_gauge", MetricType::kGauge, "A gauge.", {MetricSeries{{}, [v] { return v; }}}})
                  .ok());
  return r;
}

std::unique_ptr<MetricsServer> StartOnAnyPort(std::unique_ptr<MetricRegistry> registry) {
  MetricsServerOptions o;
  o.port = 0;
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(o, std::move(registry));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(MetricsServerTest, ServesMetricsAndNothingElse) {
  std::unique_ptr<MetricsServer> server = StartOnAnyPort(OneGauge(42));
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, "# HELP test_gauge A gauge.\n# TYPE test_gauge gauge\ntest_gauge 42\n");
  for (const char* path : {"/", "/metricsx", "/metrics/", "/other"}) {
    httplib::Result other = client.Get(path);
    ASSERT_TRUE(other) << path;
    EXPECT_EQ(other->status, 404) << path;
  }
  httplib::Result post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);
}

TEST(MetricsServerTest, PortInUseIsOneClearError) {
  std::unique_ptr<MetricsServer> first = StartOnAnyPort(OneGauge(1));
  ASSERT_NE(first, nullptr);
  MetricsServerOptions o;
  o.port = first->port();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(o, OneGauge(2));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "metrics.port: cannot listen on 127.0.0.1:" + std::to_string(o.port) + ": address in use");
  o.who = "worker process 1 (metrics.port + 2)";
  second = MetricsServer::Start(o, OneGauge(2));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), "metrics.port: cannot listen on 127.0.0.1:" + std::to_string(o.port) +
                                           " for worker process 1 (metrics.port + 2): address in use");
  // The first one still answers.
  httplib::Client client("127.0.0.1", first->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "# HELP test_gauge A gauge.\n# TYPE test_gauge gauge\ntest_gauge 1\n");
}

TEST(MetricsServerTest, AnAddressNotOfThisMachineIsOneClearError) {
  MetricsServerOptions o;
  o.bind = "192.0.2.1";  // TEST-NET-1: never assigned to a host
  o.port = 9;
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(o, OneGauge(1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "metrics.port: cannot listen on 192.0.2.1:9: address not available on this machine");
  o.port = 70000;
  s = MetricsServer::Start(o, OneGauge(1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MetricsServerTest, ServesOnIpv6Loopback) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool have_v6 = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) close(fd);
  if (!have_v6) GTEST_SKIP() << "no IPv6 loopback here";
  MetricsServerOptions o;
  o.bind = "::1";
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(o, OneGauge(7));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->address(), "[::1]:" + std::to_string((*s)->port()));
  httplib::Client client("::1", (*s)->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

// The destructor stops and joins promptly, also with a client holding an
// idle keep-alive connection, and the port is free again afterwards.
TEST(MetricsServerTest, StopsPromptlyAndFreesThePort) {
  std::unique_ptr<MetricsServer> server = StartOnAnyPort(OneGauge(3));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  ASSERT_TRUE(client.Get("/metrics"));
  const auto start = SteadyClock::now();
  server.reset();
  EXPECT_LT(std::chrono::duration<double>(SteadyClock::now() - start).count(), 3.0);
  MetricsServerOptions o;
  o.port = port;
  absl::StatusOr<std::unique_ptr<MetricsServer>> again = MetricsServer::Start(o, OneGauge(4));
  ASSERT_TRUE(again.ok()) << again.status();
  httplib::Client fresh("127.0.0.1", port);
  httplib::Result res = fresh.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "# HELP test_gauge A gauge.\n# TYPE test_gauge gauge\ntest_gauge 4\n");
}

// ---- LiveMetrics ------------------------------------------------------------

std::set<std::string> FamiliesOf(const LiveMetrics& live) {
  MetricRegistry r;
  EXPECT_TRUE(live.Register(&r).ok());
  const prometheus_text::Parsed p = prometheus_text::Parse(r.Render());
  EXPECT_TRUE(p.ok()) << p.error;
  std::set<std::string> names;
  for (const auto& [name, f] : p.families) names.insert(name);
  return names;
}

TEST(LiveMetricsTest, EachRoleServesWhatItKnows) {
  const std::set<std::string> chief = {"shardwild_samples_total",
                                       "shardwild_steps_total",
                                       "shardwild_step_phase_seconds_total",
                                       "shardwild_train_loss",
                                       "shardwild_store_version",
                                       "shardwild_store_bytes",
                                       "shardwild_tasks_requeued_total",
                                       "shardwild_worker_failures_total",
                                       "shardwild_checkpoints_written_total",
                                       "shardwild_job_records_total",
                                       "shardwild_info"};
  EXPECT_EQ(FamiliesOf(LiveMetrics(MetricsRole::kChief)), chief);
  EXPECT_EQ(FamiliesOf(LiveMetrics(MetricsRole::kWorker)),
            (std::set<std::string>{"shardwild_samples_total", "shardwild_steps_total",
                                   "shardwild_step_phase_seconds_total", "shardwild_info"}));
  EXPECT_EQ(FamiliesOf(LiveMetrics(MetricsRole::kPs)),
            (std::set<std::string>{"shardwild_store_version", "shardwild_store_bytes", "shardwild_info"}));
}

TEST(LiveMetricsTest, ReadsAttachedSourcesAndKeepsWhatTheyCounted) {
  LiveMetrics live(MetricsRole::kChief);
  MetricRegistry registry;
  ASSERT_TRUE(live.Register(&registry).ok());
  prometheus_text::Parsed p = prometheus_text::Parse(registry.Render());
  ASSERT_TRUE(p.ok()) << p.error;
  EXPECT_EQ(p.Value("shardwild_samples_total"), 0);
  EXPECT_TRUE(std::isnan(p.Value("shardwild_train_loss")));
  const prometheus_text::Sample& info = p.families.at("shardwild_info").samples.at(0);
  EXPECT_EQ(info.labels.at("role"), "chief");
  EXPECT_FALSE(info.labels.at("version").empty());
  EXPECT_EQ(info.value, 1);

  WorkerCounters a, b;
  a.samples = 100;
  a.steps = 2;
  a.phase_ns[0] = 1'500'000'000;  // data
  b.samples = 28;
  b.steps = 1;
  b.phase_ns[3] = 250'000'000;  // forward
  uint64_t version = 7;
  {
    LiveMetrics::Attachment workers = live.AttachWorkers({&a, &b});
    LiveMetrics::Attachment store = live.AttachStore([&version] { return version; }, StoreBytes{1000, 2000, 30});
    live.SetTrainLoss(0.25);
    live.SetTaskCounters(3, 1);
    live.SetJobRecords(4096);
    live.AddCheckpoint();
    live.AddCheckpoint();
    p = prometheus_text::Parse(registry.Render());
    ASSERT_TRUE(p.ok()) << p.error;
    EXPECT_EQ(p.Value("shardwild_samples_total"), 128);
    EXPECT_EQ(p.Value("shardwild_steps_total"), 3);
    EXPECT_EQ(p.Value("shardwild_step_phase_seconds_total", {{"phase", "data"}}), 1.5);
    EXPECT_EQ(p.Value("shardwild_step_phase_seconds_total", {{"phase", "forward"}}), 0.25);
    EXPECT_EQ(p.Value("shardwild_step_phase_seconds_total", {{"phase", "push_rows"}}), 0);
    EXPECT_EQ(p.families.at("shardwild_step_phase_seconds_total").samples.size(), 7u);
    EXPECT_EQ(p.Value("shardwild_train_loss"), 0.25);
    EXPECT_EQ(p.Value("shardwild_store_version"), 7);
    EXPECT_EQ(p.Value("shardwild_store_bytes", {{"kind", "params"}}), 1000);
    EXPECT_EQ(p.Value("shardwild_store_bytes", {{"kind", "slots"}}), 2000);
    EXPECT_EQ(p.Value("shardwild_store_bytes", {{"kind", "overhead"}}), 30);
    EXPECT_EQ(p.Value("shardwild_tasks_requeued_total"), 3);
    EXPECT_EQ(p.Value("shardwild_worker_failures_total"), 1);
    EXPECT_EQ(p.Value("shardwild_checkpoints_written_total"), 2);
    EXPECT_EQ(p.Value("shardwild_job_records_total"), 4096);
    // Live: a step later, the next scrape sees it.
    a.samples += 64;
    version = 9;
    EXPECT_EQ(live.Read().samples, 192);
    EXPECT_EQ(live.Read().store_version, 9u);
  }
  // Detached: the counts stay, the store's last version too.
  a.samples = 1'000'000;
  version = 1234;
  EXPECT_EQ(live.Read().samples, 192);
  EXPECT_EQ(live.Read().steps, 3);
  EXPECT_EQ(live.Read().store_version, 9u);
  // A second run's workers add to them.
  WorkerCounters c;
  c.samples = 8;
  LiveMetrics::Attachment more = live.AttachWorkers({&c});
  EXPECT_EQ(live.Read().samples, 200);
  LiveMetrics::Attachment moved = std::move(more);
  EXPECT_EQ(live.Read().samples, 200);
  moved = LiveMetrics::Attachment();  // detaches
  c.samples = 100;
  EXPECT_EQ(live.Read().samples, 200);
}

TEST(LiveMetricsTest, PortsOfTheProcesses) {
  EXPECT_EQ(MetricsProcess::Chief().port_offset, 0);
  EXPECT_EQ(MetricsProcess::WorkerProcess(0).port_offset, 1);
  EXPECT_EQ(MetricsProcess::WorkerProcess(3).port_offset, 4);
  EXPECT_EQ(MetricsProcess::PsTask(1).port_offset, 2);
  EXPECT_EQ(MetricsProcess::WorkerTask(0, 2).port_offset, 3);
  EXPECT_EQ(MetricsProcess::WorkerTask(1, 2).name, "worker:1");
  LiveMetrics live(MetricsRole::kWorker);
  MetricsOptions off;
  absl::StatusOr<std::unique_ptr<MetricsServer>> none = ServeLiveMetrics(off, MetricsProcess::Chief(), live);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  MetricsOptions high;
  high.port = 65535;
  absl::StatusOr<std::unique_ptr<MetricsServer>> beyond = ServeLiveMetrics(high, MetricsProcess::WorkerProcess(1), live);
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().message(),
            "metrics.port: 65535 + 2 for worker process 1 is beyond 65535; choose a lower metrics.port");
}

}  // namespace
}  // namespace shardwild

// RemoteWorkers (net/chief.h): the chief's session service on loopback,
// driven by raw gRPC sessions standing in for worker tasks.
#include "net/chief.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/mutex.h"
#include "gtest/gtest.h"
#include "net/chief.grpc.pb.h"
#include "net/grpc_util.h"

namespace shardwild {
namespace {

constexpr char kToken[] = "0123456789abcdef-chief-token";

using Session = grpc::ClientReaderWriter<net::SessionLine, net::SessionLine>;

class ChiefTest : public ::testing::Test {
 protected:
  void SetUp() override { StartChief(/*late_join_wait_s=*/0); }

  // (Re)starts the chief's service: 2 worker tasks of 1 thread.
  void StartChief(double late_join_wait_s) {
    workers_.reset();
    {
      MutexLock lock(&log_mu_);
      log_.clear();
    }
    ChiefServerOptions o;
    o.server.bind_address = "127.0.0.1:0";
    o.server.task_name = "chief:0";
    o.server.token = kToken;
    o.worker_tasks = 2;
    o.threads_per_task = 1;
    o.late_join_wait_s = late_join_wait_s;
    o.log = [this](const std::string& line) {
      MutexLock lock(&log_mu_);
      log_.push_back(line);
    };
    absl::StatusOr<std::unique_ptr<RemoteWorkers>> w = RemoteWorkers::Start(o);
    ASSERT_TRUE(w.ok()) << w.status();
    workers_ = *std::move(w);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", workers_->port()), grpc::InsecureChannelCredentials());
    stub_ = net::Chief::NewStub(channel_);
  }

  struct Open {
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<Session> stream;
    bool Write(const std::string& line) {
      net::SessionLine m;
      m.set_line(line);
      return stream->Write(m);
    }
    std::optional<std::string> Read() {
      net::SessionLine m;
      if (!stream->Read(&m)) return std::nullopt;
      return m.line();
    }
  };
  // A session sending `lines` first; with `token` false it carries none.
  Open Connect(const std::vector<std::string>& lines, bool token = true) {
    Open o;
    if (token) o.context->AddMetadata(kTokenMetadataKey, absl::StrCat("Bearer ", kToken));
    o.stream = stub_->Session(o.context.get());
    for (const std::string& l : lines) o.Write(l);
    return o;
  }
  // The status a session refused at once ends with.
  grpc::Status Refused(const std::vector<std::string>& lines, bool token = true) {
    Open o = Connect(lines, token);
    o.stream->WritesDone();
    EXPECT_FALSE(o.Read().has_value());
    return o.stream->Finish();
  }
  // The next line the loop would see on `slot`, waiting up to 10 s.
  std::optional<std::string> NextLine(Slot& slot) {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (slot.channel->NextLine(&line)) return line;
      pollfd p{slot.fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0 && !slot.channel->Fill()) {
        if (slot.channel->NextLine(&line)) return line;
        return std::nullopt;  // the session ended
      }
    }
    ADD_FAILURE() << "no line within 10 s";
    return std::nullopt;
  }

  // Ends the chief's service (destroys it) on another thread, as the trainer
  // does once its summary is made; the future is ready when it has ended.
  std::future<void> EndChiefInBackground() {
    return std::async(std::launch::async, [this] { workers_.reset(); });
  }
  // The chief's log so far, joined by newlines.
  std::string Log() {
    MutexLock lock(&log_mu_);
    return absl::StrJoin(log_, "\n");
  }
  // Waits up to 10 s for a log line containing `text`.
  bool WaitForLog(const std::string& text) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
  std::unique_ptr<RemoteWorkers> workers_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<net::Chief::Stub> stub_;
};

TEST_F(ChiefTest, RefusesSessionsItCannotPlace) {
  // Before the loop opens the slots (the chief still setting up): retry.
  const grpc::Status early = Refused({"hello 0 0 1"});
  EXPECT_EQ(early.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(early.error_message().find("has not opened this slot yet; retry"), std::string::npos)
      << early.error_message();
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  EXPECT_EQ(Refused({"hello 0 0 1"}, /*token=*/false).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Refused({"hi there"}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status out_of_range = Refused({"hello 2 0 1"});
  EXPECT_EQ(out_of_range.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out_of_range.error_message().find("worker:2 is not a worker task"), std::string::npos)
      << out_of_range.error_message();
  const grpc::Status threads = Refused({"hello 0 0 4"});
  EXPECT_EQ(threads.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(threads.error_message().find("runs 4 worker threads, the chief expects 1"), std::string::npos);
  // Nothing reached the slots.
  for (Slot& s : workers_->slots()) EXPECT_TRUE(workers_->awaiting(s));
  // A slot given up on takes no session.
  Slot& s1 = workers_->slots()[1];
  workers_->Reap(s1, /*kill_first=*/true);
  EXPECT_EQ(Refused({"hello 1 0 1"}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ChiefTest, LinesFlowBothWaysAndTheEndIsSeen) {
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  Slot& slot = workers_->slots()[1];
  EXPECT_TRUE(workers_->awaiting(slot));
  Open w = Connect({"hello 1 0 1", "ready 4242 100 10"});
  EXPECT_EQ(NextLine(slot), "ready 4242 100 10");
  EXPECT_FALSE(workers_->awaiting(slot));
  EXPECT_TRUE(workers_->awaiting(workers_->slots()[0]));
  // A second session for the same slot waits for the first to be reaped.
  EXPECT_EQ(Refused({"hello 1 0 1"}).error_code(), grpc::StatusCode::ABORTED);

  ASSERT_TRUE(slot.channel->Send("task 7 1 0 32 0 0.01"));
  EXPECT_EQ(w.Read(), "task 7 1 0 32 0 0.01");
  ASSERT_TRUE(w.Write("hb"));
  ASSERT_TRUE(w.Write("done 7 32 1 3.5 20"));
  EXPECT_EQ(NextLine(slot), "hb");
  EXPECT_EQ(NextLine(slot), "done 7 32 1 3.5 20");

  // The worker task goes away: the loop sees the end of the channel.
  w.stream->WritesDone();
  w.context->TryCancel();
  (void)w.stream->Finish();
  EXPECT_EQ(NextLine(slot), std::nullopt);
  // Reaped and opened again, the slot takes the worker task back.
  workers_->Reap(slot, /*kill_first=*/false);
  ASSERT_TRUE(workers_->Spawn(slot).ok());
  Open back = Connect({"hello 1 0 1", "ready 4243 100 10"});
  EXPECT_EQ(NextLine(slot), "ready 4243 100 10");

  // exit reaches every connected worker task.
  std::thread exiter([&] { workers_->ExitAll(/*grace_s=*/5); });
  EXPECT_EQ(back.Read(), "exit");
  back.stream->WritesDone();
  (void)back.stream->Finish();
  exiter.join();
  for (const Slot& s : workers_->slots()) EXPECT_LE(s.pid, 0);
}

TEST_F(ChiefTest, AWorkerTaskThatNeverJoinedHearsTheJobIsOver) {
  // A worker task slow to start: the job ends before it joins. The chief
  // waits for it (up to late_join_wait_s after its start) and tells it the
  // job is over, so it exits cleanly instead of finding no chief.
  StartChief(/*late_join_wait_s=*/120);
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  Slot& joined = workers_->slots()[1];
  Open w = Connect({"hello 1 0 1", "ready 4242 100 10"});
  ASSERT_EQ(NextLine(joined), "ready 4242 100 10");
  std::thread exiter([&] { workers_->ExitAll(/*grace_s=*/5); });
  EXPECT_EQ(w.Read(), "exit");
  w.stream->WritesDone();
  (void)w.stream->Finish();
  exiter.join();  // ExitAll itself does not wait for the late one
  EXPECT_EQ(Log().find("never joined"), std::string::npos) << Log();
  // Its end (the trainer's summary made) does.
  std::future<void> ender = EndChiefInBackground();
  ASSERT_TRUE(WaitForLog("for worker:0 thread 0, which never joined, to hear so")) << Log();
  // The wait names the setting it came from (the options' default here).
  EXPECT_NE(Log().find("(late_join_wait_s from the chief's start)"), std::string::npos) << Log();
  EXPECT_EQ(ender.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the chief did not wait for the worker task that never joined";
  const grpc::Status late = Refused({"hello 0 0 1"});
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(late.error_message().find("worker:0 thread 0: the job is over"), std::string::npos)
      << late.error_message();
  // Told, it is waited for no longer (long before the 120 s).
  ASSERT_EQ(ender.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(Log().find("never joined; such a worker task stops on its own"), std::string::npos) << Log();
  // The joined worker task was not waited for: it heard `exit`.
  EXPECT_EQ(Log().find("worker:1 thread 0"), std::string::npos) << Log();
}

TEST_F(ChiefTest, TheWaitForAWorkerTaskThatNeverJoinsEnds) {
  StartChief(/*late_join_wait_s=*/0.5);
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  workers_->ExitAll(/*grace_s=*/5);
  std::future<void> ender = EndChiefInBackground();
  ASSERT_EQ(ender.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(WaitForLog("warning: chief:0: worker:0 thread 0, worker:1 thread 0 never joined; such a worker task "
                         "stops on its own once it has found no chief for late_join_wait_s"))
      << Log();
  // Past the deadline (late_join_wait_s 0) it says so at once.
  StartChief(/*late_join_wait_s=*/0);
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  workers_->ExitAll(/*grace_s=*/5);
  workers_.reset();
  EXPECT_EQ(Log().find("waiting up to"), std::string::npos) << Log();
  EXPECT_NE(Log().find("never joined"), std::string::npos) << Log();
}

TEST_F(ChiefTest, AFailedJobWaitsForNoOne) {
  // No ExitAll: the job failed, and the chief ends at once, waiting for no
  // worker task and saying nothing about those that never joined.
  StartChief(/*late_join_wait_s=*/120);
  for (Slot& s : workers_->slots()) ASSERT_TRUE(workers_->Spawn(s).ok());
  std::future<void> ender = EndChiefInBackground();
  ASSERT_EQ(ender.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(Log(), "");
}

TEST(ChiefOptionsTest, RejectsABadLateJoinWait) {
  ChiefServerOptions o;
  o.server.bind_address = "127.0.0.1:0";
  o.server.task_name = "chief:0";
  o.server.token = kToken;
  o.late_join_wait_s = -1;
  absl::StatusOr<std::unique_ptr<RemoteWorkers>> w = RemoteWorkers::Start(o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("late_join_wait_s must be a finite number >= 0, got -1"), std::string::npos)
      << w.status();
}

}  // namespace
}  // namespace shardwild

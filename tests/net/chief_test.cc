// RemoteWorkers (net/chief.h): the chief's session service on loopback,
// driven by raw gRPC sessions standing in for worker tasks.
#include "net/chief.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "net/chief.grpc.pb.h"
#include "net/grpc_util.h"

namespace shardwild {
namespace {

constexpr char kToken[] = "0123456789abcdef-chief-token";

using Session = grpc::ClientReaderWriter<net::SessionLine, net::SessionLine>;

class ChiefTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ChiefServerOptions o;
    o.server.bind_address = "127.0.0.1:0";
    o.server.task_name = "chief:0";
    o.server.token = kToken;
    o.worker_tasks = 2;
    o.threads_per_task = 1;
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

}  // namespace
}  // namespace shardwild

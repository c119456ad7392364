// Collective (net/allreduce.h): ranks as threads of this process, each with
// its own Gloo mesh over loopback TCP, meeting at rank 0's rendezvous.
#include "net/allreduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "free_ports.h"

namespace shardwild {
namespace {

using ::testing::HasSubstr;
using testing_ports::FreePorts;

CollectiveOptions Options(int rank, int size, int port, double timeout_s = 20,
                          AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing) {
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
             AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing) {
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

INSTANTIATE_TEST_SUITE_P(RingAndHalvingDoubling, CollectiveAlgorithms,
                         ::testing::Values(AllreduceAlgorithm::kRing, AllreduceAlgorithm::kHalvingDoubling));

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
  // Rank 1 leaves only once rank 0's Connect has returned: Gloo's mesh is
  // complete on a rank before it is on its peer, so a rank that left at once
  // could fail its peer's Connect instead of its first collective (CI saw
  // "Connection closed by peer" from rank 0's Connect).
  std::promise<void> rank0_connected;
  std::shared_future<void> connected = rank0_connected.get_future().share();
  absl::Status rank1_connect;
  std::thread rank1([&] {
    absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(1, 2, port, 5));
    rank1_connect = c.status();
    connected.wait();
    // Leaves without taking part: its sockets close.
  });
  absl::StatusOr<std::unique_ptr<Collective>> c = Collective::Connect(Options(0, 2, port, 5));
  rank0_connected.set_value();
  rank1.join();
  ASSERT_TRUE(rank1_connect.ok()) << rank1_connect;
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data(1000, 1.0f);
  const absl::Status s = (*c)->AllreduceSum(data.data(), data.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("allreduce: allreduce over 2 ranks failed on rank 0"));
}

void ProgramsOwnSigpipeHandler(int) {}

// Gloo sends with writev(): once a process has connected, a write to a
// socket whose peer is gone is EPIPE, not a SIGPIPE that kills it (a rank
// killed mid-collective must fail its peers' collective, not end them). A
// handler the program installed itself is kept.
TEST(Collective, AfterConnectAWriteToADeadPeerIsAnErrorNotASignal) {
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &saved), 0);
  ASSERT_NE(signal(SIGPIPE, SIG_DFL), SIG_ERR);
  OnRanks(1, [](int, Collective& c) { EXPECT_EQ(c.size(), 1); });
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  const char byte = 1;
  errno = 0;
  EXPECT_EQ(write(fds[0], &byte, 1), -1);  // with SIGPIPE's default, the test process ends here
  EXPECT_EQ(errno, EPIPE);
  close(fds[0]);

  ASSERT_NE(signal(SIGPIPE, ProgramsOwnSigpipeHandler), SIG_ERR);
  OnRanks(1, [](int, Collective&) {});
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &ProgramsOwnSigpipeHandler);
  ASSERT_EQ(sigaction(SIGPIPE, &saved, nullptr), 0);
}

// Sums 1 over the group, re-forming once if the first try fails (a member
// left, or closed its sockets): the group's size, or -1 on failure.
int SumAfterAtMostOneReform(Collective& c) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    float x = 1.0f;
    const absl::Status s = c.AllreduceSum(&x, 1);
    if (s.ok()) return static_cast<int>(x);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(c.failed());
    if (attempt == 0) {
      const absl::Status re = c.Reform();
      EXPECT_TRUE(re.ok()) << re;
      if (!re.ok()) return -1;
    }
  }
  return -1;
}

// A rank whose mesh fails to connect (as when a peer dies under the
// connect) asks for the next generation and connects that one: its Connect
// succeeds. The others' meshes of generation 0 lose it and re-form too.
TEST(Collective, AFailedConnectFormsTheNextGeneration) {
  const int port = FreePorts(1)[0];
  std::unique_ptr<Collective> c[3];
  std::vector<std::thread> threads;
  int sizes[3] = {0, 0, 0};
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions o = Options(r, 3, port, 10);
      if (r == 1) {
        o.after_connect_for_test = [](int64_t generation) {
          if (generation == 0) throw std::runtime_error("Connection closed by peer (test)");
        };
      }
      absl::StatusOr<std::unique_ptr<Collective>> got = Collective::Connect(o);
      ASSERT_TRUE(got.ok()) << "rank " << r << ": " << got.status();
      c[r] = *std::move(got);
      sizes[r] = SumAfterAtMostOneReform(*c[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(c[0] && c[1] && c[2]);
  EXPECT_EQ(c[1]->generation(), 1);  // generation 0's connect failed on it
  EXPECT_EQ(c[1]->lost_at_last_forming(), 0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sizes[r], 3) << "rank " << r;
    EXPECT_EQ(c[r]->generation(), 1) << "rank " << r;
    EXPECT_EQ(c[r]->size(), 3);
  }
}

// A rank that dies as soon as its own Connect returns may close its
// sockets while the others still connect: whichever way the race goes,
// the survivors' Connect succeeds and they go on as 2.
TEST(Collective, ARankThatDiesWhileOthersConnectIsLeftBehind) {
  const int port = FreePorts(1)[0];
  std::vector<std::thread> threads;
  int sizes[2] = {0, 0};
  int lost[2] = {0, 0};
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> got = Collective::Connect(Options(r, 3, port, 4));
      ASSERT_TRUE(got.ok()) << "rank " << r << ": " << got.status();
      if (r == 2) return;  // dies: its sockets close
      sizes[r] = SumAfterAtMostOneReform(**got);
      lost[r] = (*got)->lost_at_last_forming();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sizes[r], 2) << "rank " << r;
    EXPECT_EQ(lost[r], 1) << "rank " << r;
  }
}

// Rank 2 of 3 leaves; the others' next allreduce fails, they re-form as 2
// and go on; a late joiner then waits until rank 0 sees it and the group
// re-forms as 3 again.
TEST(Collective, SurvivorsReformAndLateJoinersAreAdmitted) {
  const int port = FreePorts(1)[0];
  std::unique_ptr<Collective> c[3];
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::unique_ptr<Collective>> got = Collective::Connect(Options(r, 3, port, 10));
        ASSERT_TRUE(got.ok()) << got.status();
        c[r] = *std::move(got);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(c[0] && c[1] && c[2]);
  EXPECT_EQ(c[0]->generation(), 0);
  EXPECT_FALSE(c[0]->joined_late());
  c[2].reset();  // a rank dies
  std::vector<float> data(4096, 1.0f);
  auto survivor = [&](int r) {
    std::vector<float> d(4096, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = c[r]->AllreduceSum(d.data(), d.size());
    // The ring notices the closed sockets at once, not at the deadline.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 9.0);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(c[r]->failed());
    const absl::Status re = c[r]->Reform();
    ASSERT_TRUE(re.ok()) << re;
    EXPECT_EQ(c[r]->generation(), 1);
    EXPECT_EQ(c[r]->size(), 2);
    EXPECT_EQ(c[r]->rank(), r);
    EXPECT_EQ(c[r]->lost_at_last_forming(), 1);
    EXPECT_FALSE(c[r]->failed());
    std::fill(d.begin(), d.end(), static_cast<float>(r + 1));
    ASSERT_TRUE(c[r]->AllreduceSum(d.data(), d.size()).ok());
    EXPECT_EQ(d[0], 3.0f);
    EXPECT_EQ(d[4095], 3.0f);
  };
  std::thread s1([&] { survivor(1); });
  survivor(0);
  s1.join();
  // A newcomer joins; rank 0 sees it waiting, and both members re-form.
  std::unique_ptr<Collective> newcomer;
  std::thread joiner([&] {
    absl::StatusOr<std::unique_ptr<Collective>> got = Collective::Connect(Options(2, 3, port, 10));
    ASSERT_TRUE(got.ok()) << got.status();
    newcomer = *std::move(got);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!c[0]->joiners_waiting() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(c[0]->joiners_waiting());
  EXPECT_FALSE(c[1]->joiners_waiting());  // only rank 0 keeps the membership
  std::thread r1([&] { ASSERT_TRUE(c[1]->Reform().ok()); });
  ASSERT_TRUE(c[0]->Reform().ok());
  r1.join();
  joiner.join();
  ASSERT_NE(newcomer, nullptr);
  EXPECT_TRUE(newcomer->joined_late());
  EXPECT_EQ(newcomer->generation(), 2);
  EXPECT_EQ(newcomer->size(), 3);
  EXPECT_EQ(newcomer->rank(), 2);
  EXPECT_EQ(c[0]->lost_at_last_forming(), 0);
  Collective* all[3] = {c[0].get(), c[1].get(), newcomer.get()};
  std::vector<std::thread> sums;
  for (int r = 0; r < 3; ++r) {
    sums.emplace_back([&, r] {
      std::vector<float> d(100, 1.0f);
      ASSERT_TRUE(all[r]->AllreduceSum(d.data(), d.size()).ok());
      EXPECT_EQ(d[99], 3.0f);
      float x = r == 0 ? 42.0f : 0.0f;
      ASSERT_TRUE(all[r]->Broadcast(&x, 1, 0).ok());
      EXPECT_EQ(x, 42.0f);
    });
  }
  for (std::thread& t : sums) t.join();
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

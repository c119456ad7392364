#include "ps_shm/push_chunks.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using Range = std::pair<int64_t, int64_t>;

std::vector<Range> Visits(PushChunks& chunks) {
  std::vector<Range> seen;
  chunks.ForEach([&](int64_t b, int64_t e) { seen.emplace_back(b, e); });
  return seen;
}

TEST(PushChunksTest, ChunksAreWholeVectorsAndAtMostKMaxChunks) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{4097}, int64_t{235146},
                    int64_t{4096} * PushChunks::kMaxChunks, int64_t{4096} * PushChunks::kMaxChunks + 1,
                    int64_t{1} << 30, int64_t{3000000007}}) {
    SCOPED_TRACE(n);
    const int64_t chunk = PushChunks::ChunkElements(n);
    EXPECT_GE(chunk, PushChunks::kMinChunkElements);
    EXPECT_EQ(chunk % 16, 0);
    EXPECT_LE((n + chunk - 1) / chunk, PushChunks::kMaxChunks);
    // No larger than it must be: one vector less would need more chunks, or
    // be under the minimum.
    if (chunk > PushChunks::kMinChunkElements) {
      EXPECT_GT((n + chunk - 17) / (chunk - 16), PushChunks::kMaxChunks);
    }
  }
  EXPECT_EQ(PushChunks(235146).num_chunks(), 58);  // 57 whole chunks and 1674 elements
  EXPECT_EQ(PushChunks(0).num_chunks(), 0);
}

TEST(PushChunksTest, FreeChunksAreVisitedOnceInOrderAndLeftFree) {
  for (int64_t n : {int64_t{1}, int64_t{4096}, int64_t{13403}, int64_t{4096} * 300 + 5}) {
    SCOPED_TRACE(n);
    PushChunks chunks(n);
    const std::vector<Range> seen = Visits(chunks);
    ASSERT_EQ(static_cast<int>(seen.size()), chunks.num_chunks());
    int64_t at = 0;
    for (const Range& r : seen) {
      EXPECT_EQ(r.first, at);
      EXPECT_GT(r.second, r.first);
      EXPECT_LE(r.second - r.first, chunks.chunk_elements());
      at = r.second;
    }
    EXPECT_EQ(at, n);
    for (int c = 0; c < chunks.num_chunks(); ++c) EXPECT_TRUE(chunks.TryClaim(c)) << "chunk " << c << " left claimed";
  }
  PushChunks empty(0);
  EXPECT_TRUE(Visits(empty).empty());
}

TEST(PushChunksTest, AClaimedChunkIsUpdatedLastAndStaysClaimed) {
  // Chunks 1 and 3 are held as another push would hold them: they come
  // after the others, are updated all the same, and are not freed (they are
  // not this push's to free).
  PushChunks chunks(5 * PushChunks::kMinChunkElements);
  ASSERT_EQ(chunks.num_chunks(), 5);
  ASSERT_TRUE(chunks.TryClaim(1));
  ASSERT_TRUE(chunks.TryClaim(3));
  const int64_t k = PushChunks::kMinChunkElements;
  const std::vector<Range> want = {{0, k}, {2 * k, 3 * k}, {4 * k, 5 * k}, {k, 2 * k}, {3 * k, 4 * k}};
  EXPECT_EQ(Visits(chunks), want);
  EXPECT_FALSE(chunks.TryClaim(1));
  EXPECT_FALSE(chunks.TryClaim(3));
  for (int c : {0, 2, 4}) EXPECT_TRUE(chunks.TryClaim(c)) << c;
}

TEST(PushChunksTest, AChunkFreedMeanwhileIsClaimedOnTheSecondVisit) {
  // Held on the first pass, freed before the second: the second visit
  // claims it for its update (another push arriving then skips it) and
  // frees it after.
  PushChunks chunks(3 * PushChunks::kMinChunkElements);
  ASSERT_TRUE(chunks.TryClaim(0));
  std::vector<bool> claimed_during;
  chunks.ForEach([&](int64_t b, int64_t) {
    if (b == 2 * PushChunks::kMinChunkElements) chunks.Release(0);  // the holder is done
    if (b == 0) claimed_during.push_back(!chunks.TryClaim(0));
  });
  EXPECT_EQ(claimed_during, std::vector<bool>{true});
  EXPECT_TRUE(chunks.TryClaim(0));
}

TEST(PushChunksTest, APushNeverWaitsForAnother) {
  // Thread A stops inside chunk 0's update until thread B's whole push is
  // over: B must get through every chunk, chunk 0 last, without waiting.
  PushChunks chunks(4 * PushChunks::kMinChunkElements);
  absl::Notification a_inside, b_done;
  std::thread a([&] {
    chunks.ForEach([&](int64_t b, int64_t) {
      if (b == 0) {
        a_inside.Notify();
        b_done.WaitForNotification();
      }
    });
  });
  a_inside.WaitForNotification();
  std::vector<Range> seen = Visits(chunks);
  b_done.Notify();
  a.join();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen.back(), Range(0, PushChunks::kMinChunkElements));
  for (int c = 0; c < 4; ++c) EXPECT_TRUE(chunks.TryClaim(c)) << c;
}

TEST(PushChunksTest, ConcurrentPushesEachVisitEveryElementOnce) {
  // Threads pushing at once: every ForEach covers every element exactly
  // once, however the chunks were claimed and skipped.
  constexpr int kThreads = 4, kPushes = 200;
  const int64_t n = 7 * PushChunks::kMinChunkElements + 123;
  PushChunks chunks(n);
  const int nc = chunks.num_chunks();
  std::unique_ptr<std::atomic<int64_t>[]> visits(new std::atomic<int64_t>[nc]);
  for (int c = 0; c < nc; ++c) visits[c].store(0);
  std::atomic<int64_t> elements{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPushes; ++i) {
        int64_t mine = 0;
        chunks.ForEach([&](int64_t b, int64_t e) {
          visits[b / chunks.chunk_elements()].fetch_add(1, std::memory_order_relaxed);
          mine += e - b;
        });
        EXPECT_EQ(mine, n);
        elements.fetch_add(mine, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < nc; ++c) EXPECT_EQ(visits[c].load(), kThreads * kPushes) << "chunk " << c;
  EXPECT_EQ(elements.load(), int64_t{kThreads} * kPushes * n);
  for (int c = 0; c < nc; ++c) EXPECT_TRUE(chunks.TryClaim(c)) << c;
}

}  // namespace
}  // namespace shardwild

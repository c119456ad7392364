// The data kernels on every dispatch target against their scalar expression,
// bit for bit.
#include "core/data/data_kernels.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/model/hogwild_kernels.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(DataKernelsTest, BytesToUnitFloatsIsTheScalarDivisionOnEveryTarget) {
  // Every byte value, at every offset of a vector (lengths around the widest
  // vector and the IDX image width), with a sentinel past the end.
  std::vector<uint8_t> src(1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 7 + i / 256) & 0xFF);
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (int64_t n : {0, 1, 3, 15, 16, 17, 31, 33, 64, 65, 784, 1000}) {
      for (int64_t offset : {0, 1, 5}) {
        std::vector<float> out(n + 1, -1.0f);
        BytesToUnitFloats(src.data() + offset, out.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float want = static_cast<float>(src[offset + i]) / 255.0f;
          ASSERT_EQ(std::memcmp(&out[i], &want, sizeof(float)), 0)
              << "n " << n << " offset " << offset << " i " << i << ": " << out[i] << " != " << want;
        }
        EXPECT_EQ(out[n], -1.0f) << "wrote past n = " << n;
      }
    }
  }
}

TEST(DataKernelsTest, EveryByteValueMapsToItsDivision) {
  std::vector<uint8_t> all(256);
  for (int v = 0; v < 256; ++v) all[v] = static_cast<uint8_t>(v);
  std::vector<float> out(256);
  BytesToUnitFloats(all.data(), out.data(), 256);
  for (int v = 0; v < 256; ++v) EXPECT_EQ(out[v], static_cast<float>(v) / 255.0f) << v;
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[255], 1.0f);
}

// Coded entries (word = id | k << id_bits) decode on every target to the
// scalar expressions, bit for bit: records of every count around the
// vector widths (0 to 40 words), at word offsets that are and are not
// vector-aligned, into destinations with gaps between them that stay
// untouched, for id widths of 1 to 31 bits and units of 10^0 to 10^-6.
TEST(DataKernelsTest, DecodeCodedEntriesIsTheScalarDecodeOnEveryTarget) {
  std::mt19937 rng(5);
  std::vector<uint32_t> words(4096);
  for (uint32_t& w : words) w = static_cast<uint32_t>(rng());
  constexpr uint64_t kIdSentinel = 0xDEADBEEFCAFEF00Dull;
  constexpr float kWeightSentinel = -7.0f;
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (int id_bits : {1, 12, 20, 31}) {
      for (double unit : {1.0, 0.1, 0.001, 0.000001, 0.0000001}) {
        // Records of 0..40 words from scattered places, each two entries
        // after the last one's end in the destination.
        std::vector<const uint32_t*> from;
        std::vector<int64_t> count, to;
        int64_t at = 1;
        for (int64_t c = 0; c <= 40; ++c) {
          from.push_back(words.data() + (c * 97 + id_bits) % 4000);
          count.push_back(c);
          to.push_back(at);
          at += c + 2;
        }
        // A widest vector's entries of room after the last record.
        const int64_t size = at + 16;
        std::vector<uint64_t> ids(size, kIdSentinel);
        std::vector<float> weights(size, kWeightSentinel);
        for (size_t j = 0; j < from.size(); ++j) {
          DecodeCodedEntries(from[j], count[j], id_bits, unit, ids.data() + to[j], weights.data() + to[j]);
        }
        std::vector<uint8_t> written(size, 0);
        for (size_t j = 0; j < from.size(); ++j) {
          for (int64_t i = 0; i < count[j]; ++i) {
            const uint32_t word = from[j][i];
            const uint64_t want_id = word & ((uint32_t{1} << id_bits) - 1);
            const float want_weight = CodedWeight(word >> id_bits, unit);
            ASSERT_EQ(ids[to[j] + i], want_id) << "bits " << id_bits << " record " << j << " entry " << i;
            ASSERT_EQ(std::bit_cast<uint32_t>(weights[to[j] + i]), std::bit_cast<uint32_t>(want_weight))
                << "bits " << id_bits << " unit " << unit << " record " << j << " entry " << i;
            written[to[j] + i] = 1;
          }
        }
        for (int64_t i = 0; i < size; ++i) {
          if (written[i]) continue;
          ASSERT_EQ(ids[i], kIdSentinel) << "id written at " << i;
          ASSERT_EQ(weights[i], kWeightSentinel) << "weight written at " << i;
        }
      }
    }
  }
}

// The slot kernels: coded entries (DecodeCodedSlots, ids of 20 bits and
// weights of 2 or 3 decimals) or plain 32-bit ids (WidenIdSlots, which
// writes no weight).
int64_t CopySlots(bool coded, const SlotBatch& a, int64_t begin, int64_t* count) {
  return coded ? DecodeCodedSlots(a, begin, count) : WidenIdSlots(a, begin, count);
}

// The id and weight copied from a slot's `word`: the scalar decode where
// coded (the weights' unit `unit`), else the word itself and the weight
// left as the tests filled it (kUntouchedWeight).
constexpr uint64_t kUntouchedId = 0x5555;
constexpr float kUntouchedWeight = -3.0f;
testing::AssertionResult CopiedAs(bool coded, double unit, uint32_t word, uint64_t id, float weight) {
  const uint64_t want_id = coded ? word & ((1u << 20) - 1) : word;
  const float want_weight = coded ? CodedWeight(word >> 20, unit) : kUntouchedWeight;
  if (id == want_id && std::bit_cast<uint32_t>(weight) == std::bit_cast<uint32_t>(want_weight)) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "word " << word << " gave id " << id << " and weight " << weight
                                     << ", not " << want_id << " and " << want_weight;
}

// Nothing written from entry `from` on (ids and weights as the tests filled them).
testing::AssertionResult UntouchedFrom(const std::vector<uint64_t>& ids, const std::vector<float>& weights,
                                       int64_t from) {
  for (size_t i = static_cast<size_t>(from); i < ids.size(); ++i) {
    if (ids[i] != kUntouchedId || weights[i] != kUntouchedWeight) {
      return testing::AssertionFailure() << "entry " << i << " written (first untouched entry: " << from << ")";
    }
  }
  return testing::AssertionSuccess();
}

// A batch's slots copied out in one pass, on every target, as the scalar
// expressions give them: labels (and label sets and their offsets where
// asked for), every slot's entries from the running count on, the offsets,
// the count. A record whose slot holds the overflow word is copied from
// its block after the slots, in the same pass where the room allows, else
// the call stops before it and goes on from it when called with more room.
// Nothing is written past the last record's entries (the kernel writes
// what it reads, so nothing is read past them either) or past the room.
TEST(DataKernelsTest, SlotKernelsCopySlotsAndBlocksAfterThem) {
  constexpr uint64_t kOverflow = ~uint64_t{0};
  std::mt19937 rng(9);
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (bool coded : {true, false}) {
      for (int64_t stride : {2, 9, 16, 24}) {  // slots of 2, 16, 30 and 46 entries
        for (bool sets : {false, true}) {
          for (bool tight : {false, true}) {
            SCOPED_TRACE(testing::Message() << (coded ? "coded" : "plain ids") << ", stride " << stride
                                            << (sets ? ", label sets" : "")
                                            << (tight ? ", room for the slots only" : ""));
            const int64_t entries = 2 * (stride - 1);
            constexpr int64_t kSlots = 40;
            // Record 7's block after the slots: longer than any slot.
            const uint32_t block_count = static_cast<uint32_t>(entries + 9);
            const int64_t block_at = kSlots * stride;
            std::vector<uint64_t> words(block_at + 1 + (block_count + 1) / 2 + 1);
            for (uint64_t& w : words) w = (uint64_t{rng()} << 32) | rng();
            std::vector<uint32_t> counts(kSlots);
            auto write_head = [&](int64_t at, uint32_t count) {
              const int32_t label = static_cast<int32_t>(rng() % 5);
              std::memcpy(&words[at], &count, 4);
              std::memcpy(reinterpret_cast<char*>(&words[at]) + 4, &label, 4);
            };
            for (int64_t r = 0; r < kSlots; ++r) {
              counts[r] = static_cast<uint32_t>(rng() % (entries + 1));
              write_head(r * stride, counts[r]);
            }
            counts[7] = block_count;
            words[7 * stride] = kOverflow;
            words[7 * stride + 1] = static_cast<uint64_t>(block_at);
            write_head(block_at, block_count);
            auto head_of = [&](int64_t r) { return r == 7 ? block_at : r * stride; };
            const std::vector<int32_t> records = {3, 0, 39, 7, 12, 12, 5, 38, 1};
            const int64_t n = static_cast<int64_t>(records.size());
            constexpr int64_t kStart = 5;  // entries already loaded
            // Just what record 7's block and the 5 slots after it need where
            // it starts, or (tight) one entry short.
            const int64_t at_block = kStart + counts[3] + counts[0] + counts[39];
            const int64_t room = at_block + block_count + (n - 4) * entries - (tight ? 1 : 0);
            std::vector<uint64_t> ids(room + 64, kUntouchedId);
            std::vector<float> weights(room + 64, kUntouchedWeight);
            std::vector<int32_t> labels(n, -9), label_sets(n, -9);
            std::vector<int64_t> label_offsets(n + 1, -9), offsets(n + 1, -9);
            SlotBatch a{.words = words.data(),
                        .stride_words = stride,
                        .overflow_word = kOverflow,
                        .records = records.data(),
                        .n = n,
                        .entries = entries,
                        .id_bits = 20,
                        .unit = 0.001,
                        .ids = ids.data(),
                        .weights = coded ? weights.data() : nullptr,
                        .room = room,
                        .labels = labels.data(),
                        .label_sets = sets ? label_sets.data() : nullptr,
                        .label_offsets = label_offsets.data(),
                        .offsets = offsets.data()};
            int64_t count = kStart;
            if (tight) {
              ASSERT_EQ(CopySlots(coded, a, 0, &count), 3);  // records[3] is 7
              EXPECT_EQ(labels[3], -9);
              EXPECT_EQ(offsets[4], -9);
              ASSERT_TRUE(UntouchedFrom(ids, weights, room));
              a.room = room + 1;  // the block and the slots after it fit now
            }
            ASSERT_EQ(CopySlots(coded, a, tight ? 3 : 0, &count), n);
            int64_t want = kStart;
            for (int64_t s = 0; s < n; ++s) {
              const int64_t r = records[s];
              int32_t label;
              std::memcpy(&label, reinterpret_cast<const char*>(&words[head_of(r)]) + 4, 4);
              EXPECT_EQ(labels[s], label) << s;
              EXPECT_EQ(label_sets[s], sets ? label : -9) << s;
              EXPECT_EQ(label_offsets[s + 1], sets ? s + 1 : -9) << s;
              // The record's entries, where the next record did not write over them.
              const char* from = reinterpret_cast<const char*>(&words[head_of(r) + 1]);
              for (uint32_t i = 0; i < counts[r]; ++i) {
                uint32_t word;
                std::memcpy(&word, from + 4 * i, 4);
                ASSERT_TRUE(CopiedAs(coded, 0.001, word, ids[want + i], weights[want + i]))
                    << "record " << s << " entry " << i;
              }
              want += counts[r];
              EXPECT_EQ(offsets[s + 1], want) << s;
            }
            EXPECT_EQ(count, want);
            // The last slot wrote nothing past its slot's words.
            EXPECT_TRUE(UntouchedFrom(ids, weights, want - counts[records[n - 1]] + entries));
          }
        }
      }
    }
  }
}

// A slot of every count from 0 to its words, each copied to its count on
// every target (both kernels copy the whole slot whatever its count, and the
// next slot's entries overwrite its tail: the counts around each vector
// width, 4, 8 and 16 words, and a full slot are where that goes wrong), and
// nothing written past the last slot's words.
TEST(DataKernelsTest, SlotKernelsCopyEveryCountOfASlot) {
  std::mt19937 rng(11);
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (bool coded : {true, false}) {
      for (int64_t stride : {9, 16, 24}) {  // slots of 16, 30 and 46 entries
        SCOPED_TRACE(testing::Message() << (coded ? "coded" : "plain ids") << ", stride " << stride);
        const int64_t entries = 2 * (stride - 1);
        const int64_t n = entries + 1;  // record r holds r entries
        std::vector<uint64_t> words(n * stride);
        for (uint64_t& w : words) w = (uint64_t{rng()} << 32) | rng();
        std::vector<int32_t> records(n);
        for (int64_t r = 0; r < n; ++r) {
          records[r] = static_cast<int32_t>(n - 1 - r);  // the longest first: each slot overwrites the last's tail
          const uint32_t count = static_cast<uint32_t>(r);
          std::memcpy(&words[r * stride], &count, 4);
        }
        const int64_t room = n * entries;
        std::vector<uint64_t> ids(room + 64, kUntouchedId);
        std::vector<float> weights(room + 64, kUntouchedWeight);
        std::vector<int32_t> labels(n);
        std::vector<int64_t> label_offsets(n + 1), offsets(n + 1);
        SlotBatch a{.words = words.data(), .stride_words = stride, .overflow_word = ~uint64_t{0},
                    .records = records.data(), .n = n, .entries = entries, .id_bits = 20, .unit = 0.01,
                    .ids = ids.data(), .weights = coded ? weights.data() : nullptr, .room = room,
                    .labels = labels.data(), .label_sets = nullptr, .label_offsets = label_offsets.data(),
                    .offsets = offsets.data()};
        int64_t count = 0;
        ASSERT_EQ(CopySlots(coded, a, 0, &count), n);
        int64_t at = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t r = records[s];
          const char* from = reinterpret_cast<const char*>(&words[r * stride + 1]);
          for (int64_t i = 0; i < r; ++i) {
            uint32_t word;
            std::memcpy(&word, from + 4 * i, 4);
            ASSERT_TRUE(CopiedAs(coded, 0.01, word, ids[at + i], weights[at + i])) << "count " << r << " entry " << i;
          }
          at += r;
          ASSERT_EQ(offsets[s + 1], at) << s;
        }
        EXPECT_EQ(count, at);
        EXPECT_TRUE(UntouchedFrom(ids, weights, at - records[n - 1] + entries));
      }
    }
  }
}

// Every code below 2^24 of every unit 10^0 .. 10^-kFloatCodeMaxDecimals
// (ids of 8 bits: the words' top 24 bits are the code) decodes on every
// target to CodedWeight's float, bit for bit: on the targets that fuse
// multiply-adds (which must exist on any x86 CPU with AVX2) through the
// float path and its correction, elsewhere through doubles. A float path
// rounded once too few (k * y alone) would differ for millions of codes.
TEST(DataKernelsTest, EveryCodeBelowTwoTo24DecodesToCodedWeightOnEveryTarget) {
  constexpr int kIdBits = 8;
  constexpr uint32_t kCodes = uint32_t{1} << 24;
  constexpr uint32_t kChunk = uint32_t{1} << 20;
  std::vector<uint32_t> words(kChunk);
  std::vector<uint64_t> ids(kChunk);
  std::vector<float> weights(kChunk);
  int float_targets = 0;
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    double unit_inverse = 1.0;
    bool in_floats = false;
    for (int d = 0; d <= kFloatCodeMaxDecimals; ++d, unit_inverse *= 10.0) {
      const double unit = 1.0 / unit_inverse;
      in_floats = DecodesWeightsInFloats(kIdBits, unit);
      for (uint32_t first = 0; first < kCodes; first += kChunk) {
        for (uint32_t i = 0; i < kChunk; ++i) words[i] = (first + i) << kIdBits | (i & 0xFF);
        DecodeCodedEntries(words.data(), kChunk, kIdBits, unit, ids.data(), weights.data());
        for (uint32_t i = 0; i < kChunk; ++i) {
          const float want = CodedWeight(first + i, unit);
          if (std::bit_cast<uint32_t>(weights[i]) != std::bit_cast<uint32_t>(want) || ids[i] != (i & 0xFF)) {
            FAIL() << "10^-" << d << " code " << first + i << (in_floats ? " (floats)" : " (doubles)") << ": weight "
                   << weights[i] << " id " << ids[i] << ", not " << want << " and " << (i & 0xFF);
          }
        }
      }
    }
    if (in_floats) ++float_targets;
    // Codes that may reach 2^24 (ids of 7 bits) or units past the checked
    // ones go through doubles.
    EXPECT_FALSE(DecodesWeightsInFloats(7, 0.001));
    EXPECT_FALSE(DecodesWeightsInFloats(kIdBits, 1e-7));
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_GT(float_targets, 0) << "no target took the float path";
  }
}

// CodedWeight is k * unit rounded once: the float nearest k / 10^d.
TEST(DataKernelsTest, CodedWeightRoundsOnce) {
  EXPECT_EQ(CodedWeight(0, 0.001), 0.0f);
  EXPECT_EQ(CodedWeight(299, 0.001), 0.299f);
  EXPECT_EQ(CodedWeight(1, 1.0), 1.0f);
  EXPECT_EQ(CodedWeight(4095, 0.001), 4.095f);
  EXPECT_EQ(CodedWeight(123456, 0.000001), 0.123456f);
}

}  // namespace
}  // namespace shardwild

// The data kernels (data_kernels.h), compiled for every x86 target Highway
// can reach (HWY_COMPILE_ALL_ATTAINABLE, set in CMakeLists.txt) and
// dispatched at run time.

// This file includes itself once per target (Highway's foreach_target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/data/data_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstring>

#include "core/data/data_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void BytesToUnitFloatsImpl(const uint8_t* src, float* dst, int64_t n) {
  // Whole vectors of floats, each from a quarter-width vector of bytes.
  // k / 255 as k / 256 + k * kUnitFloatLow (data_kernels.h): two multiplies
  // and an add in place of a division, which on AVX-512 is issued once in
  // 8-16 cycles (the MLP's batch of 128 images, 100,352 bytes, spent most of
  // its data phase dividing).
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto high = hn::Set(df, kUnitFloatHigh);
  const auto low = hn::Set(df, kUnitFloatLow);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto k = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(du8, src + i)));
    hn::StoreU(hn::Add(hn::Mul(k, high), hn::Mul(k, low)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = UnitFloat(src[i]);
}

// One record's words, one at a time (the words are in uint64 storage: read
// as bytes).
inline void DecodeWords(const uint32_t* src, int64_t m, int id_bits, double unit, uint64_t* id_to, float* weight_to) {
  for (int64_t i = 0; i < m; ++i) {
    uint32_t word;
    std::memcpy(&word, reinterpret_cast<const char*>(src) + i * sizeof(uint32_t), sizeof(word));
    id_to[i] = word & ((uint32_t{1} << id_bits) - 1);
    weight_to[i] = CodedWeight(word >> id_bits, unit);
  }
}

// f(i) for the vectors of `lanes` words that cover [0, m) (m >= lanes): i =
// 0, lanes, 2 * lanes, ..., and m - lanes last where m is not a whole number
// of vectors, overlapping the one before (it computes the same values
// again). The loop of DecodeRecord and WidenIds.
template <class F>
HWY_INLINE void EachVector(int64_t m, int64_t lanes, const F& f) {
  int64_t i = 0;
  for (; i + lanes <= m; i += lanes) f(i);
  if (i < m) f(m - lanes);
}

// A record's m words decoded: a vector of words at a time (EachVector),
// each half widened to ids and, through doubles, to weights (AVX-512: 16
// words, the 30 of a 128-byte slot in two, the second overlapping the
// first); words one at a time where m is less than a vector. Reads and
// writes nothing past m. Inlined into the loops below, which hoist its
// constants.
HWY_INLINE void DecodeRecord(const uint32_t* src, int64_t m, int id_bits, double unit, uint64_t* id_to,
                             float* weight_to) {
#if HWY_TARGET == HWY_SCALAR
  DecodeWords(src, m, id_bits, unit, id_to, weight_to);
#else
  const hn::ScalableTag<uint32_t> du;
  const hn::Half<decltype(du)> dh;
  const hn::Rebind<int32_t, decltype(dh)> dhi;
  const hn::Rebind<uint64_t, decltype(dh)> d64;
  const hn::Rebind<double, decltype(dh)> df64;
  const hn::Rebind<float, decltype(dh)> df32;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const int64_t half = static_cast<int64_t>(hn::Lanes(dh));
  if (m < lanes) {
    DecodeWords(src, m, id_bits, unit, id_to, weight_to);
    return;
  }
  const auto mask = hn::Set(du, (uint32_t{1} << id_bits) - 1);
  const auto vunit = hn::Set(df64, unit);
  auto decode = [&](int64_t i) HWY_ATTR {
    const auto words = hn::LoadU(du, src + i);
    const auto id = hn::And(words, mask);
    hn::StoreU(hn::PromoteTo(d64, hn::LowerHalf(dh, id)), d64, id_to + i);
    hn::StoreU(hn::PromoteTo(d64, hn::UpperHalf(dh, id)), d64, id_to + i + half);
    const auto k = hn::ShiftRightSame(words, id_bits);
    const auto lower = hn::BitCast(dhi, hn::LowerHalf(dh, k)), upper = hn::BitCast(dhi, hn::UpperHalf(dh, k));
    hn::StoreU(hn::DemoteTo(df32, hn::Mul(hn::PromoteTo(df64, lower), vunit)), df32, weight_to + i);
    hn::StoreU(hn::DemoteTo(df32, hn::Mul(hn::PromoteTo(df64, upper), vunit)), df32, weight_to + i + half);
  };
  EachVector(m, lanes, decode);
#endif
}

void DecodeCodedEntriesImpl(const uint32_t* from, int64_t count, int id_bits, double unit, uint64_t* ids,
                            float* weights) {
  DecodeRecord(from, count, id_bits, unit, ids, weights);
}

// m 32-bit ids from `src` widened into id_to[0, m): whole vectors, the
// last one overlapping the one before where m is not a whole number of them
// (a 128-byte slot's 30 ids: two AVX-512 vectors, four AVX2 ones); one at a
// time where m is less than a vector. Reads and writes nothing past m.
HWY_INLINE void WidenIds(const uint32_t* src, int64_t m, uint64_t* id_to) {
  // One at a time (the words are in uint64 storage: read as bytes).
  auto one_by_one = [&] {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t id;
      std::memcpy(&id, reinterpret_cast<const char*>(src) + i * sizeof(uint32_t), sizeof(id));
      id_to[i] = id;
    }
  };
#if HWY_TARGET == HWY_SCALAR
  one_by_one();
#else
  const hn::ScalableTag<uint32_t> du;
  const hn::Half<decltype(du)> dh;
  const hn::Rebind<uint64_t, decltype(dh)> d64;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const int64_t half = static_cast<int64_t>(hn::Lanes(dh));
  if (m < lanes) {
    one_by_one();
    return;
  }
  auto widen = [&](int64_t i) HWY_ATTR {
    const auto v = hn::LoadU(du, src + i);
    hn::StoreU(hn::PromoteTo(d64, hn::LowerHalf(dh, v)), d64, id_to + i);
    hn::StoreU(hn::PromoteTo(d64, hn::UpperHalf(dh, v)), d64, id_to + i + half);
  };
  EachVector(m, lanes, widen);
#endif
}

// DecodeCodedSlots and WidenIdSlots: one loop over the slots, the entries
// decoded (kCoded) or widened.
template <bool kCoded>
HWY_INLINE int64_t SlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count) {
  int64_t at = *count;
  int64_t s = begin;
  for (; s < a.n; ++s) {
    const uint64_t* block = a.words + static_cast<int64_t>(a.records[s]) * a.stride_words;
    uint32_t c;
    int32_t label;
    std::memcpy(&c, block, sizeof(c));
    int64_t words = a.entries;  // a slot's words (those past its count unread)
    if (block[0] == a.overflow_word) {
      // The record's block is after the slots (rarely: a predicted branch),
      // decoded to its count where that leaves every later slot its entries.
      block = a.words + block[1];
      std::memcpy(&c, block, sizeof(c));
      words = c;
      if (at + words + (a.n - s - 1) * a.entries > a.room) break;
    }
    std::memcpy(&label, reinterpret_cast<const char*>(block) + sizeof(c), sizeof(label));
    a.labels[s] = label;
    if (a.label_sets != nullptr) {
      a.label_sets[s] = label;
      a.label_offsets[s + 1] = s + 1;
    }
    // A slot's words are all decoded or widened, whatever its count: those
    // past it are overwritten by the next record's or left unread, and no
    // branch on the count is mispredicted. Coded entries decoded only to
    // the count (libsvm's records of 10 to 30 entries: one or two AVX-512
    // vectors) took sparse_logreg.yaml's data phase to 1.43 us a step
    // against 1.25 decoded whole (AVX2, four vectors a slot against three
    // on average: 1.78 against 1.63; 8 alternating rounds each on the
    // 2-core EPYC VM, medians, lower in 8 and 7 of the 8 pairs).
    if constexpr (kCoded) {
      DecodeRecord(reinterpret_cast<const uint32_t*>(block + 1), words, a.id_bits, a.unit, a.ids + at, a.weights + at);
    } else {
      WidenIds(reinterpret_cast<const uint32_t*>(block + 1), words, a.ids + at);
    }
    at += c;
    a.offsets[s + 1] = at;
  }
  *count = at;
  return s;
}

int64_t DecodeCodedSlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count) {
  return SlotsImpl<true>(a, begin, count);
}

int64_t WidenIdSlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count) {
  return SlotsImpl<false>(a, begin, count);
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardwild {

HWY_EXPORT(BytesToUnitFloatsImpl);
HWY_EXPORT(DecodeCodedEntriesImpl);
HWY_EXPORT(DecodeCodedSlotsImpl);
HWY_EXPORT(WidenIdSlotsImpl);

void BytesToUnitFloats(const uint8_t* src, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(BytesToUnitFloatsImpl)(src, dst, n);
}

void DecodeCodedEntries(const uint32_t* from, int64_t count, int id_bits, double unit, uint64_t* ids, float* weights) {
  if (count > 0) HWY_DYNAMIC_DISPATCH(DecodeCodedEntriesImpl)(from, count, id_bits, unit, ids, weights);
}

int64_t DecodeCodedSlots(const SlotBatch& a, int64_t begin, int64_t* count) {
  if (begin >= a.n) return a.n;
  return HWY_DYNAMIC_DISPATCH(DecodeCodedSlotsImpl)(a, begin, count);
}

int64_t WidenIdSlots(const SlotBatch& a, int64_t begin, int64_t* count) {
  if (begin >= a.n) return a.n;
  return HWY_DYNAMIC_DISPATCH(WidenIdSlotsImpl)(a, begin, count);
}

}  // namespace shardwild
#endif  // HWY_ONCE

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

// What a slot kernel writes from a record's words: ids only (WidenIdSlots),
// or ids and weights (DecodeCodedSlots and DecodeCodedEntries), the
// weights through doubles (CodedWeight's own expression) or through floats
// (the correction below), which give the same floats.
enum class Entries { kIds, kIdsAndWeights, kIdsAndFloatWeights };

// CodedWeight(k, unit) in floats, where k < 2^24 (an exact float) and the
// unit is 10^-d, d <= 6 (so 10^d, `ten_to_d`, is an exact float too):
// q = k * y, with y the float nearest 10^-d, is within an ulp of k / 10^d;
// its remainder k - q * 10^d is exact in one fused multiply-add, and q plus
// the remainder times y, in a second, is the float nearest k / 10^d
// (Markstein's correction). CodedWeight gives that float too, for every
// such k and d: the tests check all 2^24 codes of every unit, on every
// target, bit for bit. Only where multiply-adds are fused (HWY_NATIVE_FMA):
// a multiply and an add rounded apart would lose the remainder's exactness.
// One conversion of 16 words to floats on AVX-512, where the doubles took
// two conversions each way.
inline constexpr int kFloatCodeMinIdBits = 32 - 24;  // every k of a word below 2^24

// Whether the float path decodes `unit`'s codes: 10^-d for d up to
// kFloatCodeMaxDecimals (the units the tests check exhaustively; the
// correction holds to 10^-10, where 10^d is still an exact float), and
// its constants.
inline bool FloatCodeUnit(double unit, float* y, float* ten_to_d) {
  double p = 1.0;
  for (int d = 0; d <= kFloatCodeMaxDecimals; ++d, p *= 10.0) {
    if (unit == 1.0 / p) {
      *y = static_cast<float>(unit);
      *ten_to_d = static_cast<float>(p);
      return true;
    }
  }
  return false;
}

// A record's entries copied from its words into ids (and weights) at the
// destinations, `m` words: the lanes' constants made once (the slot kernels
// make one for the whole batch, whose loop then keeps them in registers).
template <Entries kEntries>
class RecordCopy {
 public:
  HWY_INLINE RecordCopy(int id_bits, double unit, float y, float ten_to_d)
      : id_bits_(id_bits), id_mask_((uint32_t{1} << (id_bits & 31)) - 1), unit_(unit)
#if HWY_TARGET != HWY_SCALAR
        ,
        mask_(hn::Set(du_, id_mask_)),
        vunit_(hn::Set(df64_, unit)),
        y_(hn::Set(df_, y)),
        ten_to_d_(hn::Set(df_, ten_to_d))
#endif
  {
    static_cast<void>(y);
    static_cast<void>(ten_to_d);
  }

  // m words from `src` into id_to[0, m) (and weight_to[0, m)): whole
  // vectors, the last one overlapping the one before where m is not a
  // whole number of them (a 128-byte slot's 30 words: two AVX-512 vectors,
  // four AVX2 ones); one word at a time where m is less than a vector.
  // Reads and writes nothing past m.
  HWY_INLINE void operator()(const uint32_t* src, int64_t m, uint64_t* id_to, float* weight_to) const {
#if HWY_TARGET == HWY_SCALAR
    Words(src, m, id_to, weight_to);
#else
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(du_));
    if (m < lanes) {
      Words(src, m, id_to, weight_to);
      return;
    }
    int64_t i = 0;
    for (; i + lanes <= m; i += lanes) Vector(src, i, id_to, weight_to);
    if (i < m) Vector(src, m - lanes, id_to, weight_to);
#endif
  }

 private:
  // One word at a time (the words are in uint64 storage: read as bytes).
  HWY_INLINE void Words(const uint32_t* src, int64_t m, uint64_t* id_to, float* weight_to) const {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t word;
      std::memcpy(&word, reinterpret_cast<const char*>(src) + i * sizeof(uint32_t), sizeof(word));
      if constexpr (kEntries == Entries::kIds) {
        id_to[i] = word;
      } else {
        id_to[i] = word & id_mask_;
        weight_to[i] = CodedWeight(word >> id_bits_, unit_);
      }
    }
  }

  const int id_bits_;
  const uint32_t id_mask_;
  const double unit_;
#if HWY_TARGET != HWY_SCALAR
  // The vector of words at i, each half widened to ids, the weights
  // converted as kEntries says.
  HWY_INLINE void Vector(const uint32_t* src, int64_t i, uint64_t* id_to, float* weight_to) const {
    const int64_t half = static_cast<int64_t>(hn::Lanes(dh_));
    const auto words = hn::LoadU(du_, src + i);
    const auto id = kEntries == Entries::kIds ? words : hn::And(words, mask_);
    hn::StoreU(hn::PromoteTo(d64_, hn::LowerHalf(dh_, id)), d64_, id_to + i);
    hn::StoreU(hn::PromoteTo(d64_, hn::UpperHalf(dh_, id)), d64_, id_to + i + half);
    if constexpr (kEntries == Entries::kIdsAndFloatWeights) {
      const auto k = hn::ConvertTo(df_, hn::BitCast(di_, hn::ShiftRightSame(words, id_bits_)));
      const auto q = hn::Mul(k, y_);
      const auto remainder = hn::NegMulAdd(q, ten_to_d_, k);
      hn::StoreU(hn::MulAdd(remainder, y_, q), df_, weight_to + i);
    } else if constexpr (kEntries == Entries::kIdsAndWeights) {
      const auto k = hn::ShiftRightSame(words, id_bits_);
      const auto lower = hn::BitCast(dhi_, hn::LowerHalf(dh_, k)), upper = hn::BitCast(dhi_, hn::UpperHalf(dh_, k));
      hn::StoreU(hn::DemoteTo(df32h_, hn::Mul(hn::PromoteTo(df64_, lower), vunit_)), df32h_, weight_to + i);
      hn::StoreU(hn::DemoteTo(df32h_, hn::Mul(hn::PromoteTo(df64_, upper), vunit_)), df32h_, weight_to + i + half);
    }
  }

  hn::ScalableTag<uint32_t> du_;
  hn::RebindToSigned<decltype(du_)> di_;
  hn::RebindToFloat<decltype(du_)> df_;
  hn::Half<decltype(du_)> dh_;
  hn::Rebind<int32_t, decltype(dh_)> dhi_;
  hn::Rebind<uint64_t, decltype(dh_)> d64_;
  hn::Rebind<double, decltype(dh_)> df64_;
  hn::Rebind<float, decltype(dh_)> df32h_;
  const hn::Vec<decltype(du_)> mask_;
  const hn::Vec<decltype(df64_)> vunit_;
  const hn::Vec<decltype(df_)> y_, ten_to_d_;
#endif
};

// Which weight path decodes codes of `id_bits` and `unit` here, and its
// constants: floats where this target fuses multiply-adds and every code
// is below 2^24 (ids of 8 bits or more) in a unit the float path takes,
// else doubles.
inline bool UseFloatWeights(int id_bits, double unit, float* y, float* ten_to_d) {
  *y = 0.0f;
  *ten_to_d = 0.0f;
  return HWY_NATIVE_FMA && id_bits >= kFloatCodeMinIdBits && FloatCodeUnit(unit, y, ten_to_d);
}

void DecodeCodedEntriesImpl(const uint32_t* from, int64_t count, int id_bits, double unit, uint64_t* ids,
                            float* weights) {
  float y, ten_to_d;
  if (UseFloatWeights(id_bits, unit, &y, &ten_to_d)) {
    RecordCopy<Entries::kIdsAndFloatWeights>(id_bits, unit, y, ten_to_d)(from, count, ids, weights);
  } else {
    RecordCopy<Entries::kIdsAndWeights>(id_bits, unit, y, ten_to_d)(from, count, ids, weights);
  }
}

// DecodeCodedSlots and WidenIdSlots: one loop over the slots, the entries
// decoded or widened as kEntries says.
template <Entries kEntries>
HWY_INLINE int64_t SlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count, float y, float ten_to_d) {
  // The batch's fields and the copy's constants in locals, once: read
  // through `a` inside the loop, whose stores the compiler cannot tell
  // apart from `a`'s fields, each was loaded again for every record and
  // the constants made again (about 30 instructions a record in `perf
  // annotate`). With the float weights (RecordCopy), on the 2-core Xeon
  // VM: sparse_logreg's batch in L1 (BM_DataPhase what:2 shape:1) 0.70-0.78
  // -> 0.59-0.66 us, its slots alone (BM_DecodeCodedSlots, AVX3) 0.50 ->
  // 0.40 us against 0.30-0.38 us to copy the same bytes; the kernel is then
  // its stores, 30 ids and weights a record whatever its count.
  const uint64_t* const words = a.words;
  const int64_t stride = a.stride_words, n = a.n, entries = a.entries, room = a.room;
  const uint64_t overflow_word = a.overflow_word;
  const int32_t* const records = a.records;
  uint64_t* const ids = a.ids;
  float* const weights = a.weights;
  int32_t* const labels = a.labels;
  int32_t* const label_sets = a.label_sets;
  int64_t* const label_offsets = a.label_offsets;
  int64_t* const offsets = a.offsets;
  const RecordCopy<kEntries> copy(a.id_bits, a.unit, y, ten_to_d);
  int64_t at = *count;
  int64_t s = begin;
  for (; s < n; ++s) {
    const uint64_t* block = words + static_cast<int64_t>(records[s]) * stride;
    uint32_t c;
    int32_t label;
    std::memcpy(&c, block, sizeof(c));
    int64_t m = entries;  // a slot's words (those past its count unread)
    if (block[0] == overflow_word) {
      // The record's block is after the slots (rarely: a predicted branch),
      // decoded to its count where that leaves every later slot its entries.
      block = words + block[1];
      std::memcpy(&c, block, sizeof(c));
      m = c;
      if (at + m + (n - s - 1) * entries > room) break;
    }
    std::memcpy(&label, reinterpret_cast<const char*>(block) + sizeof(c), sizeof(label));
    labels[s] = label;
    if (label_sets != nullptr) {
      label_sets[s] = label;
      label_offsets[s + 1] = s + 1;
    }
    // A slot's words are all decoded or widened, whatever its count: those
    // past it are overwritten by the next record's or left unread, and no
    // branch on the count is mispredicted. Coded entries decoded only to
    // the count (libsvm's records of 10 to 30 entries: one or two AVX-512
    // vectors) took sparse_logreg.yaml's data phase to 1.43 us a step
    // against 1.25 decoded whole (AVX2, four vectors a slot against three
    // on average: 1.78 against 1.63; 8 alternating rounds each on the
    // 2-core EPYC VM, medians, lower in 8 and 7 of the 8 pairs).
    copy(reinterpret_cast<const uint32_t*>(block + 1), m, ids + at, kEntries == Entries::kIds ? nullptr : weights + at);
    at += c;
    offsets[s + 1] = at;
  }
  *count = at;
  return s;
}

int64_t DecodeCodedSlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count) {
  float y, ten_to_d;
  if (UseFloatWeights(a.id_bits, a.unit, &y, &ten_to_d)) {
    return SlotsImpl<Entries::kIdsAndFloatWeights>(a, begin, count, y, ten_to_d);
  }
  return SlotsImpl<Entries::kIdsAndWeights>(a, begin, count, y, ten_to_d);
}

bool DecodesWeightsInFloatsImpl(int id_bits, double unit) {
  float y, ten_to_d;
  return UseFloatWeights(id_bits, unit, &y, &ten_to_d);
}

int64_t WidenIdSlotsImpl(const SlotBatch& a, int64_t begin, int64_t* count) {
  return SlotsImpl<Entries::kIds>(a, begin, count, 0.0f, 0.0f);
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
HWY_EXPORT(DecodesWeightsInFloatsImpl);

bool DecodesWeightsInFloats(int id_bits, double unit) {
  return HWY_DYNAMIC_DISPATCH(DecodesWeightsInFloatsImpl)(id_bits, unit);
}

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

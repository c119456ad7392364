// Kernels of the data phase: private buffers only (no parameter memory, no
// races), written once with Google Highway and dispatched at run time to the
// best instruction set of the CPU, like the Hogwild kernels (whose
// ScopedHogwildKernelTarget restricts these too: the dispatch is one
// process-wide setting).
#pragma once

#include <cstdint>

namespace shardwild {

// k / 255.0f for a byte k, without a division: k * 2^-8 is exact (k has 8
// bits), and k * kUnitFloatLow (the float nearest 1/255 - 1/256) is within
// 2^-24 of its own value, so the sum is within about 2^-40 of k / 255 before
// its one rounding, and k / 255 (a denominator of 255, odd) is never that
// close to a point halfway between two floats: the sum rounds to the
// correctly rounded quotient, for all 256 bytes. That holds whether the
// compiler fuses the first multiply with the add (k * 2^-8 is exact) or the
// second (one rounding of the exact sum); the tests check every byte on
// every target.
inline constexpr float kUnitFloatHigh = 0x1p-8f;
inline constexpr float kUnitFloatLow = static_cast<float>(1.0 / 255.0 - 1.0 / 256.0);
constexpr float UnitFloat(uint8_t k) {
  return static_cast<float>(k) * kUnitFloatHigh + static_cast<float>(k) * kUnitFloatLow;
}

// dst[i] = static_cast<float>(src[i]) / 255.0f for i in [0, n), bit for bit
// on every target (UnitFloat: no division), so the floats are exactly the
// IDX reader's pixels (PackedRecords keeps them as these bytes).
void BytesToUnitFloats(const uint8_t* src, float* dst, int64_t n);

// A weight kept as a whole number k of units 10^-d (PackedRecords::WeightCode
// in core/model/model.h): k * unit in double, rounded once to float, the
// nearest float to k / 10^d (as a parser gives) for the k and d that code
// weights. k < 2^31, so the conversion is the signed one every target has.
inline float CodedWeight(uint32_t k, double unit) {
  return static_cast<float>(static_cast<double>(static_cast<int32_t>(k)) * unit);
}

// Whether the coded-entry kernels below, on the target they dispatch to
// now, convert the weights of words with `id_bits` of id in units of
// `unit` through floats (two fused multiply-adds correcting k * 10^-d:
// where the target fuses them, every k is below 2^24, id_bits >= 8, and
// unit is 10^-d for d <= kFloatCodeMaxDecimals) rather than through
// doubles. Either way each weight is CodedWeight's, bit for bit (the
// tests check every k below 2^24 of every such unit); this says which
// path the tests are checking.
inline constexpr int kFloatCodeMaxDecimals = 6;
bool DecodesWeightsInFloats(int id_bits, double unit);

// One packed record's entries whose weights are coded in their ids' words
// (word = id | k << id_bits, 1 <= id_bits <= 31): its `count` words, from
// `from`, into ids[i] = word & (2^id_bits - 1) (widened) and weights[i] =
// CodedWeight(word >> id_bits, unit), bit for bit on every target. Reads
// and writes no entry past `count` (the last vector overlaps the one
// before, where the count is not a whole number of vectors).
void DecodeCodedEntries(const uint32_t* from, int64_t count, int id_bits, double unit, uint64_t* ids, float* weights);

// A batch's slots (Model::LoadSlots) of coded entries (DecodeCodedSlots) or
// of plain 32-bit ids (WidenIdSlots), copied out in one pass.
// Record records[s]'s slot is words[records[s] * stride_words, ...): its
// head word (the count, uint32, in its first 4 bytes and the label, int32,
// in the next 4), then `entries` words' worth of entries (uint32 each: a
// coded entry as DecodeCodedEntries reads it, or an id), the record's first
// `count` of them. A slot whose first word is `overflow_word` holds the
// record elsewhere: its second word is where in `words` its block is, the
// same head and then its `count` entries, as many as it has.
struct SlotBatch {
  const uint64_t* words = nullptr;
  int64_t stride_words = 0;
  uint64_t overflow_word = 0;
  const int32_t* records = nullptr;
  int64_t n = 0;
  int64_t entries = 0;  // entries after a slot's first word
  int id_bits = 0;      // 1..31 (coded entries only)
  double unit = 0;      // (coded entries only)
  uint64_t* ids = nullptr;  // [room]
  float* weights = nullptr;  // [room] (coded entries only)
  int64_t room = 0;
  int32_t* labels = nullptr;          // [n]
  int32_t* label_sets = nullptr;      // [n], or null: then label_offsets is not written
  int64_t* label_offsets = nullptr;   // [n + 1]
  int64_t* offsets = nullptr;         // [n + 1]
};

// From record `begin` on: each record's label into labels[s] (and
// label_sets[s] = label, label_offsets[s + 1] = s + 1 where label_sets is
// not null), its entries decoded into ids and weights from *count on (a
// slot's `entries` words whatever its count, those past the count
// overwritten by the next record's or left unread; a block after the slots
// to its count), then
// *count += its count and offsets[s + 1] = *count. The caller gives room
// for `entries` from *count on for every slot; a block after the slots is
// decoded where its count leaves that room for every later slot, else the
// call stops before its record. Returns where it stopped: n, or that
// record, to be called again from there with more room. Reads no word past
// a slot's `entries` or a block's count. One pass: a slot's first line is
// read as the one before it is decoded.
int64_t DecodeCodedSlots(const SlotBatch& a, int64_t begin, int64_t* count);

// DecodeCodedSlots for slots of plain ids (id_bits, unit and weights
// unused): each slot's `entries` words widened to ids whatever its count
// (as many vector copies for every record: no branch on the count to
// mispredict; the words past the count are overwritten by the next
// record's or left unread), a block after the slots to its count. The same
// labels, offsets, room and return.
int64_t WidenIdSlots(const SlotBatch& a, int64_t begin, int64_t* count);

}  // namespace shardwild

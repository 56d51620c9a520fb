// Kernels of the arc_v3 codec: the dense, data-parallel steps of encoding and decoding.
//
// Every kernel exists three times under one name: ref::Foo (plain C++ in
// ref_kernels.cc, the definition), HWY_NAMESPACE::Foo (Highway, in kernels.cc) and
// arc_v3::Foo (this header: runtime dispatch to the best target the CPU supports).
// Outputs are byte-identical across targets; tests check every compiled target against
// ref:: (tests/codec/kernels_test.cc).
//
// BF16 bit layout (uint16_t):  s eeeeeeee mmmmmmm
//                              15 14    7 6     0
#ifndef ARC_V3_SRC_CODEC_KERNELS_H_
#define ARC_V3_SRC_CODEC_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace arc_v3 {

// Bits of a BF16 XOR outside the mantissa: a change there is an "exponent or sign" change.
constexpr uint16_t kHighFieldMask = 0xFF80;
constexpr uint16_t kMantissaMask = 0x007F;

struct ChangeCounts {
  uint64_t changed = 0;  // src[i] != dst[i]
  uint64_t high = 0;     // of those, (src[i] ^ dst[i]) & kHighFieldMask != 0
};

// Bytes of `count` 7-bit fields packed LSB-first.
constexpr size_t PackedMantissaBytes(size_t count) { return (count * 7 + 7) / 8; }

// XOR + classification: counts the changed elements and those changing sign/exponent.
ChangeCounts ClassifyChanges(const uint16_t* src, const uint16_t* dst, size_t count);

// Compaction: writes, in element order, the index i (< count <= 2^32) and src[i] ^ dst[i]
// of every changed element to positions[] / xors[], which must hold as many entries as
// there are changes. Returns the number of changes. Writes nothing beyond them.
size_t CompactChanges(const uint16_t* src, const uint16_t* dst, size_t count, uint32_t* positions,
                      uint16_t* xors);

// Mantissa packing: the low 7 bits of xors[k] go to bits [7k, 7k+7) of out
// (bit b = bit b%8 of byte b/8). Writes exactly PackedMantissaBytes(count) bytes.
void PackMantissas(const uint16_t* xors, size_t count, uint8_t* out);

// Inverse of PackMantissas: xors[k] = 7-bit field k (upper 9 bits zero). Reads exactly
// PackedMantissaBytes(count) bytes.
void UnpackMantissas(const uint8_t* packed, size_t count, uint16_t* xors);

// Apply: out[i] = src[i] ^ xors[i]. `out` may equal `src` or `xors`.
void ApplyXor(const uint16_t* src, const uint16_t* xors, size_t count, uint16_t* out);

// Change rates of the modelled coder (model_coder.cc): an element whose exponent field is
// e changes at a relative rate 2^RateLog(e), RateLog(e) = clamp(kRateTopExponent - e, 0,
// kMaxRateLog). kRateTopExponent is the exponent of 2^7, above any weight's usual size.
// A chunk may cap the rates lower (its Rate_Cap): the rate of a weight
// so small that it changes in most steps says little more than that.
constexpr int kRateTopExponent = 134;
constexpr int kMaxRateLog = 32;

// Group rate sums: sums[g] = the sum of 2^min(RateLog, rate_cap) over elements
// [4g, 4g + 4) of src, for g < groups (src holds 4 * groups elements), rate_cap in
// [0, kMaxRateLog]. Exact: each sum is below 2^35.
// @return the largest RateLog of the elements before the cap (0 for no groups): the cap
// changed a rate if and only if it is above rate_cap.
int GroupRateSums(const uint16_t* src, size_t groups, int rate_cap, uint64_t* sums);

// log2(v) in Q16 for v >= 1, integer only (the coders' cost estimates must not depend on
// the machine): the integer part from the top bit, 16 fraction bits by
// repeated squaring of the mantissa in Q30.
inline uint32_t Log2Q16(uint64_t v) {
  const int top = 63 - __builtin_clzll(v);
  uint64_t m = top >= 30 ? v >> (top - 30) : v << (30 - top);  // [2^30, 2^31)
  uint32_t frac = 0;
  for (int bit = 15; bit >= 0; --bit) {
    m = (m * m) >> 30;
    if (m >= (uint64_t{1} << 31)) {
      m >>= 1;
      frac |= 1u << bit;
    }
  }
  return (static_cast<uint32_t>(top) << 16) | frac;
}

// The exponent field of a BF16 bit pattern (bits 7-14).
inline int ExponentOf(uint16_t bits) { return (bits >> 7) & 0xFF; }

// Monotone integer key of a BF16 bit pattern: a bijection on uint16 such that the key
// order is the value order (-NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN); -0 and +0
// are neighbours, so stepping across zero is +-1.
inline uint16_t MonotoneKey(uint16_t bits) {
  return (bits & 0x8000) ? static_cast<uint16_t>(0x7FFF - (bits & 0x7FFF))
                         : static_cast<uint16_t>(bits | 0x8000);
}
inline uint16_t FromMonotoneKey(uint16_t key) {
  return (key & 0x8000) ? static_cast<uint16_t>(key & 0x7FFF)
                        : static_cast<uint16_t>(0x8000 | (0x7FFF - key));
}

// Session history (model_coder.h): one byte per element; bits 0-2 the age of its last
// change (0: none recorded, 1: the previous step, ..., 7: seven or more steps ago), bit 3
// set if that change went up in MonotoneKey order, bits 4-7 unused.
constexpr uint8_t kHistoryAgeMask = 0x07;
constexpr uint8_t kHistoryUp = 0x08;

// Group rate sums with a session history: as GroupRateSums, with each element's capped
// RateLog moved by boosts[history[i] & kHistoryAgeMask] and clamped to [0, rate_cap]
// again (a boost of -kMaxRateLog gives the element rate 1 whatever its exponent).
// history holds 4 * groups bytes.
void HistoryRateSums(const uint16_t* src, const uint8_t* history, const int8_t boosts[8],
                     size_t groups, int rate_cap, uint64_t* sums);

// Recent elements: those whose last change was 1..kRecentAges steps ago (a modelled chunk
// codes them first, model_coder.cc).
constexpr int kRecentAges = 2;
inline bool IsRecent(uint8_t history) {
  const int age = history & kHistoryAgeMask;
  return age != 0 && age <= kRecentAges;
}

// Writes the indices i < count with IsRecent(history[i]) to positions, ascending.
// positions has room for count entries. @return how many it wrote.
size_t RecentPositions(const uint8_t* history, size_t count, uint32_t* positions);

// Advances a session history by one step src -> dst: a changed element gets age 1 and
// the direction of its change (history = 1 | (up ? kHistoryUp : 0)); an unchanged one
// with age 1..6 ages by one (history = (history & kHistoryUp) | (age + 1)); ages 0 and 7
// stay as they are (the whole byte).
void AdvanceHistory(const uint16_t* src, const uint16_t* dst, size_t count, uint8_t* history);

// Interleaved rANS decoding of the element symbols of an rANS chunk (rans_coder.h,
// src/codec/FORMAT.md "rANS chunk"). kRansLanes coder states; element i of src (i < count) is coded
// by state i % kRansLanes. With its class c = clamp(e - class_base, 0, kRansClasses - 1),
// e the exponent field of src[i], p = probs[c], a = splits[c] & 0xFFFF and
// b = splits[c] >> 16 (1 <= a < b < p <= 65535), a state x in [2^16, 2^32) decodes
// slot = x & 0xFFFF as: slot < a an escape (|d| >= 2, coded elsewhere), a <= slot < b
// the step d = +1 in MonotoneKey order, b <= slot < p d = -1, else unchanged; with that
// symbol's (start, frequency) = (0, a), (a, b - a), (b, p - b) or (p, 2^16 - p):
// x = frequency * (x >> 16) + slot - start; then, if x < 2^16, x = x << 16 | the next
// 16-bit little-endian word of `words`.
// With a session history (`history` not null, one byte per element, model_coder.h) the
// tables have kRansTables entries and element i uses entry c + kRansClasses * h, its
// history class h = RansHistoryClass(history[i]): 0 if no change is recorded, 1 if the
// last recorded change went up, 2 if it went down. Without one, h = 0 (the first
// kRansClasses entries).
// Appends, for every changed element, its index to positions and its XOR with the new
// value to xors (0 for an escape); both need room for count + kRansLanes entries.
// Advances *words_used (words read so far, of num_words) and updates states[]. Returns
// the number of changes, or kRansWordsExhausted if a state needed a word past num_words
// (the stream is corrupt; outputs unspecified).
constexpr int kRansClasses = 16;
constexpr int kRansHistoryClasses = 3;
constexpr int kRansTables = kRansClasses * kRansHistoryClasses;
constexpr size_t kRansLanes = 16;
constexpr uint32_t kRansLow = 1u << 16;  // states live in [kRansLow, 2^32)
constexpr size_t kRansWordsExhausted = ~size_t{0};
constexpr int RansHistoryClass(uint8_t history) {
  return (history & kHistoryAgeMask) == 0 ? 0 : (history & kHistoryUp) ? 1 : 2;
}
size_t DecodeRansChanges(const uint16_t* src, size_t count, int class_base, const uint32_t* probs,
                         const uint32_t* splits, uint32_t states[kRansLanes], const uint8_t* words,
                         size_t num_words, size_t* words_used, uint32_t* positions, uint32_t* xors,
                         const uint8_t* history = nullptr);

// The encoder of the element symbols DecodeRansChanges decodes: elements count-1 down to
// 0 of src -> dst, element i on state i % kRansLanes (states start at kRansLow for a new
// stream). Each element's symbol follows from src[i] and dst[i] (unchanged; +1 or -1 in
// MonotoneKey order; any other change an escape); with its (start, frequency) from its
// class as in DecodeRansChanges: if x >= frequency << 16, the low 16 bits of x are
// pushed and x >>= 16; then x = (x / frequency) << 16 | x % frequency, plus start.
// Pushes the words to `pushed` in the order they are produced (room for count +
// kRansLanes): the stream holds them in reverse. Returns the number pushed. `history` and
// the tables' size: as in DecodeRansChanges.
size_t EncodeRansElements(const uint16_t* src, const uint16_t* dst, size_t count, int class_base,
                          const uint32_t* probs, const uint32_t* splits,
                          uint32_t states[kRansLanes], uint16_t* pushed,
                          const uint8_t* history = nullptr);

// Name of the target the dispatching wrappers above run on now ("AVX3", "EMU128", ...).
const char* DispatchedTargetName();

namespace ref {
ChangeCounts ClassifyChanges(const uint16_t* src, const uint16_t* dst, size_t count);
size_t CompactChanges(const uint16_t* src, const uint16_t* dst, size_t count, uint32_t* positions,
                      uint16_t* xors);
void PackMantissas(const uint16_t* xors, size_t count, uint8_t* out);
void UnpackMantissas(const uint8_t* packed, size_t count, uint16_t* xors);
void ApplyXor(const uint16_t* src, const uint16_t* xors, size_t count, uint16_t* out);
int GroupRateSums(const uint16_t* src, size_t groups, int rate_cap, uint64_t* sums);
void HistoryRateSums(const uint16_t* src, const uint8_t* history, const int8_t boosts[8],
                     size_t groups, int rate_cap, uint64_t* sums);
size_t RecentPositions(const uint8_t* history, size_t count, uint32_t* positions);
void AdvanceHistory(const uint16_t* src, const uint16_t* dst, size_t count, uint8_t* history);
size_t DecodeRansChanges(const uint16_t* src, size_t count, int class_base, const uint32_t* probs,
                         const uint32_t* splits, uint32_t states[kRansLanes], const uint8_t* words,
                         size_t num_words, size_t* words_used, uint32_t* positions, uint32_t* xors,
                         const uint8_t* history = nullptr);
size_t EncodeRansElements(const uint16_t* src, const uint16_t* dst, size_t count, int class_base,
                          const uint32_t* probs, const uint32_t* splits,
                          uint32_t states[kRansLanes], uint16_t* pushed,
                          const uint8_t* history = nullptr);
}  // namespace ref

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_KERNELS_H_

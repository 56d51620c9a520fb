// Highway implementations of the kernels in kernels.h, compiled once per SIMD target and
// dispatched at runtime. Each must match its ref:: twin byte for byte; vectors only speed
// up the loops, they never change the result. Tails shorter than a vector run the
// reference code on the remaining elements (Highway 1.0.3 has no LoadN/StoreN).
#include <cstring>

#include "src/codec/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/codec/kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace arc_v3 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lane counters are u16; flush them before they can wrap.
constexpr size_t kMaxVectorsPerFlush = 0xFFFF;

template <class D>
uint64_t SumLanes(D d, hn::Vec<D> v) {
  HWY_ALIGN uint16_t lanes[hn::MaxLanes(d)];
  hn::Store(v, d, lanes);
  uint64_t sum = 0;
  for (size_t i = 0; i < hn::Lanes(d); ++i) sum += lanes[i];
  return sum;
}

ChangeCounts ClassifyChanges(const uint16_t* HWY_RESTRICT src, const uint16_t* HWY_RESTRICT dst,
                             size_t count) {
  const hn::ScalableTag<uint16_t> d;
  const size_t N = hn::Lanes(d);
  const auto zero = hn::Zero(d);
  const auto high_mask = hn::Set(d, kHighFieldMask);
  ChangeCounts counts;
  size_t i = 0;
  while (i + N <= count) {
    // Each true lane adds 1: VecFromMask is all-ones (= -1) and we subtract it.
    auto changed = zero;
    auto high = zero;
    for (size_t v = 0; v < kMaxVectorsPerFlush && i + N <= count; ++v, i += N) {
      const auto x = hn::Xor(hn::LoadU(d, src + i), hn::LoadU(d, dst + i));
      changed = hn::Sub(changed, hn::VecFromMask(d, hn::Ne(x, zero)));
      high = hn::Sub(high, hn::VecFromMask(d, hn::Ne(hn::And(x, high_mask), zero)));
    }
    counts.changed += SumLanes(d, changed);
    counts.high += SumLanes(d, high);
  }
  const ChangeCounts tail = ref::ClassifyChanges(src + i, dst + i, count - i);
  counts.changed += tail.changed;
  counts.high += tail.high;
  return counts;
}

// Most vectors have no change at the densities of weight deltas, so the loop only tests
// them. With AVX-512, a vector with changes is compressed in registers and stored with a
// mask of its first `count` lanes (indices as u32 lanes, XORs as u16; compress-to-memory
// instructions are microcoded and slow on AMD Zen 4). Elsewhere, where 16-bit masked
// stores are emulated lane by lane, its mask is stored as bits (lane 0 = bit 0, whatever
// the width) and its set bits walked. Either way nothing beyond the changes is written.
size_t CompactChanges(const uint16_t* HWY_RESTRICT src, const uint16_t* HWY_RESTRICT dst,
                      size_t count, uint32_t* HWY_RESTRICT positions, uint16_t* HWY_RESTRICT xors) {
  size_t n = 0;
  size_t i = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::CappedTag<uint32_t, 16> d32;
  const hn::RebindToSigned<decltype(d32)> di32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const size_t N = hn::Lanes(d32);
  const auto zero = hn::Zero(d32);
  for (; i + N <= count; i += N) {
    const auto x = hn::PromoteTo(d32, hn::Xor(hn::LoadU(d16, src + i), hn::LoadU(d16, dst + i)));
    const auto changed = hn::Ne(x, zero);
    if (hn::AllFalse(d32, changed)) continue;
    const size_t k = hn::CountTrue(d32, changed);
    const auto index = hn::Add(hn::Iota(d32, 0), hn::Set(d32, static_cast<uint32_t>(i)));
    hn::BlendedStore(hn::Compress(index, changed), hn::FirstN(d32, k), d32, positions + n);
    // The XORs fit in 16 bits: the saturating demotion is exact.
    const auto compact_xors = hn::DemoteTo(d16, hn::BitCast(di32, hn::Compress(x, changed)));
    hn::BlendedStore(compact_xors, hn::FirstN(d16, k), d16, xors + n);
    n += k;
  }
#else
  const hn::ScalableTag<uint16_t> d;
  const size_t N = hn::Lanes(d);
  const auto zero = hn::Zero(d);
  HWY_ALIGN uint16_t lanes[hn::MaxLanes(d)];
  uint8_t mask_bits[(hn::MaxLanes(d) + 7) / 8 + 8] = {};
  for (; i + N <= count; i += N) {
    const auto x = hn::Xor(hn::LoadU(d, src + i), hn::LoadU(d, dst + i));
    const auto changed = hn::Ne(x, zero);
    if (hn::AllFalse(d, changed)) continue;
    hn::Store(x, d, lanes);
    const size_t mask_bytes = hn::StoreMaskBits(d, changed, mask_bits);
    for (size_t byte = 0; byte < mask_bytes; ++byte) {
      for (uint32_t bits = mask_bits[byte]; bits != 0; bits &= bits - 1) {
        const size_t lane = byte * 8 + static_cast<size_t>(__builtin_ctz(bits));
        positions[n] = static_cast<uint32_t>(i + lane);
        xors[n] = lanes[lane];
        ++n;
      }
    }
  }
#endif
  const size_t tail = ref::CompactChanges(src + i, dst + i, count - i, positions + n, xors + n);
  for (size_t k = n; k < n + tail; ++k) positions[k] += static_cast<uint32_t>(i);
  return n + tail;
}

// 8 mantissas form one 56-bit group (7 bytes), so a vector of N u16 lanes packs into
// N/8 groups. Three shift-and-merge steps halve the fields per lane while doubling the
// lane width: u32 lanes hold 2 fields (14 bits), u64 lanes 4 (28 bits), and the even
// u64 lane of each pair then takes its odd neighbour's 28 bits on top.
void PackMantissas(const uint16_t* HWY_RESTRICT xors, size_t count, uint8_t* HWY_RESTRICT out) {
  const hn::ScalableTag<uint16_t> d16;
  const hn::Repartition<uint32_t, decltype(d16)> d32;
  const hn::Repartition<uint64_t, decltype(d16)> d64;
  const size_t N = hn::Lanes(d16);
  size_t i = 0;
  if (N >= 8) {
    HWY_ALIGN uint64_t groups[hn::MaxLanes(d64)];
    // Each group is stored as 8 bytes, the 8th zero and overwritten by the next group;
    // stopping while a later element remains keeps that 8th byte inside `out`.
    for (; i + N < count; i += N) {
      const auto m16 = hn::And(hn::LoadU(d16, xors + i), hn::Set(d16, kMantissaMask));
      const auto v32 = hn::BitCast(d32, m16);
      const auto t32 = hn::Or(hn::And(v32, hn::Set(d32, 0x7Fu)), hn::ShiftRight<9>(v32));
      const auto v64 = hn::BitCast(d64, t32);
      const auto t64 = hn::Or(hn::And(v64, hn::Set(d64, 0x3FFFull)), hn::ShiftRight<18>(v64));
      const auto merged = hn::Or(t64, hn::ShiftLeft<28>(hn::ShiftRightLanes<1>(d64, t64)));
      hn::Store(merged, d64, groups);
      uint8_t* group_out = out + i / 8 * 7;
      for (size_t g = 0; g < N / 8; ++g) {
        const uint64_t value = groups[2 * g];
        std::memcpy(group_out + 7 * g, &value, 8);  // little-endian host
      }
    }
  }
  ref::PackMantissas(xors + i, count - i, out + i / 8 * 7);
}

void UnpackMantissas(const uint8_t* HWY_RESTRICT packed, size_t count,
                     uint16_t* HWY_RESTRICT xors) {
  // One 7-byte group per 128-bit vector: with wider vectors the group halves go through
  // memory (scalar stores, one vector load that cannot be forwarded from them), which makes
  // AVX2 slower than SSE4 (docs/format_notes.md).
  const hn::CappedTag<uint16_t, 8> d16;
  const hn::Repartition<uint32_t, decltype(d16)> d32;
  const hn::Repartition<uint64_t, decltype(d16)> d64;
  const size_t N = hn::Lanes(d16);
  size_t i = 0;
  if (N >= 8) {
    HWY_ALIGN uint64_t halves[hn::MaxLanes(d64)];
    // Reading 8 bytes per group stays inside `packed` while a later element remains.
    for (; i + N < count; i += N) {
      const uint8_t* group_in = packed + i / 8 * 7;
      for (size_t g = 0; g < N / 8; ++g) {
        uint64_t value;
        std::memcpy(&value, group_in + 7 * g, 8);
        halves[2 * g] = value;            // fields 0..3 in the low 28 bits
        halves[2 * g + 1] = value >> 28;  // fields 4..7
      }
      const auto v64 = hn::And(hn::Load(d64, halves), hn::Set(d64, 0xFFFFFFFull));
      // Inverse of the packing steps: move the upper 14 bits to the upper u32 half, then
      // the upper 7 bits of each u32 to its upper u16 half.
      const auto t64 = hn::Or(hn::And(v64, hn::Set(d64, 0x3FFFull)),
                              hn::ShiftLeft<18>(hn::And(v64, hn::Set(d64, 0xFFFC000ull))));
      const auto v32 = hn::BitCast(d32, t64);
      const auto t32 = hn::Or(hn::And(v32, hn::Set(d32, 0x7Fu)),
                              hn::ShiftLeft<9>(hn::And(v32, hn::Set(d32, 0x3F80u))));
      hn::StoreU(hn::BitCast(d16, t32), d16, xors + i);
    }
  }
  ref::UnpackMantissas(packed + i / 8 * 7, count - i, xors + i);
}

void ApplyXor(const uint16_t* src, const uint16_t* xors, size_t count, uint16_t* out) {
  const hn::ScalableTag<uint16_t> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= count; i += N) {
    hn::StoreU(hn::Xor(hn::LoadU(d, src + i), hn::LoadU(d, xors + i)), d, out + i);
  }
  ref::ApplyXor(src + i, xors + i, count - i, out + i);
}

// Rate logs are computed in 16-bit lanes; each 64-bit lane then holds one group of four
// (element 4g in its low 16 bits: every Highway target is little-endian), whose four
// powers of two are summed in place: no reduction across lanes.
// Per u64 lane: the sum of 2^f over its four u16 fields f (rate logs, each <= 32).
template <class D64>
hn::Vec<D64> GroupSumOfPowers(D64 d64, hn::Vec<D64> rate_logs) {
  const auto field = hn::Set(d64, 0xFFFF);
  const auto one = hn::Set(d64, 1);
  auto sum = hn::Shl(one, hn::And(rate_logs, field));
  sum = hn::Add(sum, hn::Shl(one, hn::And(hn::ShiftRight<16>(rate_logs), field)));
  sum = hn::Add(sum, hn::Shl(one, hn::And(hn::ShiftRight<32>(rate_logs), field)));
  return hn::Add(sum, hn::Shl(one, hn::ShiftRight<48>(rate_logs)));
}

int GroupRateSums(const uint16_t* HWY_RESTRICT src, size_t groups, int rate_cap,
                  uint64_t* HWY_RESTRICT sums) {
  const hn::ScalableTag<uint16_t> d16;
  const hn::Repartition<uint64_t, decltype(d16)> d64;
  const size_t N = hn::Lanes(d16);
  const size_t count = 4 * groups;
  const auto exponent_mask = hn::Set(d16, 0xFF);
  const auto top = hn::Set(d16, kRateTopExponent);
  const auto max_log = hn::Set(d16, kMaxRateLog);
  const auto cap = hn::Set(d16, static_cast<uint16_t>(rate_cap));
  auto largest = hn::Zero(d16);
  size_t i = 0;
  for (; N >= 4 && i + N <= count; i += N) {
    const auto exponent = hn::And(hn::ShiftRight<7>(hn::LoadU(d16, src + i)), exponent_mask);
    const auto rate_log = hn::Min(hn::SaturatedSub(top, exponent), max_log);
    largest = hn::Max(largest, rate_log);
    const auto capped = hn::Min(rate_log, cap);
    hn::StoreU(GroupSumOfPowers(d64, hn::BitCast(d64, capped)), d64, sums + i / 4);
  }
  const int rest = ref::GroupRateSums(src + i, groups - i / 4, rate_cap, sums + i / 4);
  return std::max<int>(rest, hn::GetLane(hn::MaxOfLanes(d16, largest)));
}

void HistoryRateSums(const uint16_t* HWY_RESTRICT src, const uint8_t* HWY_RESTRICT history,
                     const int8_t boosts[8], size_t groups, int rate_cap,
                     uint64_t* HWY_RESTRICT sums) {
  const hn::ScalableTag<uint16_t> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<uint8_t, decltype(d16)> d8;          // one history byte per u16 lane
  const hn::Repartition<uint8_t, decltype(d16)> bytes;  // the u16 lanes as bytes
  const hn::Repartition<uint64_t, decltype(d16)> d64;
  const size_t N = hn::Lanes(d16);
  const size_t count = 4 * groups;
  // The boost of each age, looked up per byte within each 128-bit block.
  HWY_ALIGN uint8_t table_bytes[16] = {};
  std::memcpy(table_bytes, boosts, 8);
  const auto table = hn::LoadDup128(bytes, table_bytes);
  const auto exponent_mask = hn::Set(d16, 0xFF);
  const auto age_mask = hn::Set(d16, kHistoryAgeMask);
  const auto top = hn::Set(d16, kRateTopExponent);
  const auto cap = hn::Set(d16, static_cast<uint16_t>(rate_cap));
  size_t i = 0;
  for (; N >= 4 && i + N <= count; i += N) {
    const auto exponent = hn::And(hn::ShiftRight<7>(hn::LoadU(d16, src + i)), exponent_mask);
    const auto age = hn::And(hn::PromoteTo(d16, hn::LoadU(d8, history + i)), age_mask);
    // The high byte of each lane looks up entry 0: the boost is the low byte, sign-extended.
    const auto looked_up = hn::TableLookupBytes(table, hn::BitCast(bytes, age));
    const auto boost = hn::ShiftRight<8>(hn::ShiftLeft<8>(hn::BitCast(di16, looked_up)));
    const auto capped = hn::BitCast(di16, hn::Min(hn::SaturatedSub(top, exponent), cap));
    const auto rate_log =
        hn::Min(hn::Max(hn::Add(capped, boost), hn::Zero(di16)), hn::BitCast(di16, cap));
    hn::StoreU(GroupSumOfPowers(d64, hn::BitCast(d64, rate_log)), d64, sums + i / 4);
  }
  ref::HistoryRateSums(src + i, history + i, boosts, groups - i / 4, rate_cap, sums + i / 4);
}

// MonotoneKey on lanes: a negative value's bits are all flipped, a positive one's sign bit.
template <class D>
hn::Vec<D> MonotoneKeys(D d, hn::Vec<D> bits) {
  const hn::RebindToSigned<D> di;
  const auto negative = hn::BitCast(d, hn::BroadcastSignBit(hn::BitCast(di, bits)));
  return hn::Xor(bits, hn::Or(negative, hn::Set(d, 0x8000)));
}

// Few elements are recent (about twice the density): a whole vector of history bytes is
// tested at once, and only one holding a recent element is looked at lane by lane.
size_t RecentPositions(const uint8_t* HWY_RESTRICT history, size_t count,
                       uint32_t* HWY_RESTRICT positions) {
  const hn::ScalableTag<uint8_t> d;
  const size_t N = hn::Lanes(d);
  const auto age_mask = hn::Set(d, kHistoryAgeMask);
  const auto one = hn::Set(d, 1);
  const auto last_below = hn::Set(d, kRecentAges - 1);
  uint8_t mask_bits[(hn::MaxLanes(d) + 7) / 8 + 8] = {};
  size_t n = 0;
  size_t i = 0;
  for (; i + N <= count; i += N) {
    // age - 1 wraps to 255 for age 0: min(age - 1, kRecentAges - 1) == age - 1 holds
    // exactly for 1 <= age <= kRecentAges.
    const auto below = hn::Sub(hn::And(hn::LoadU(d, history + i), age_mask), one);
    const auto is_recent = hn::Eq(hn::Min(below, last_below), below);
    if (hn::AllFalse(d, is_recent)) continue;
    const size_t mask_bytes = hn::StoreMaskBits(d, is_recent, mask_bits);
    for (size_t byte = 0; byte < mask_bytes; ++byte) {
      for (uint32_t bits = mask_bits[byte]; bits != 0; bits &= bits - 1) {
        positions[n++] = static_cast<uint32_t>(i + byte * 8 + __builtin_ctz(bits));
      }
    }
  }
  const size_t tail = ref::RecentPositions(history + i, count - i, positions + n);
  for (size_t k = n; k < n + tail; ++k) positions[k] += static_cast<uint32_t>(i);
  return n + tail;
}

void AdvanceHistory(const uint16_t* HWY_RESTRICT src, const uint16_t* HWY_RESTRICT dst,
                    size_t count, uint8_t* HWY_RESTRICT history) {
  const hn::ScalableTag<uint16_t> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<uint8_t, decltype(d16)> d8;
  const size_t N = hn::Lanes(d16);
  const auto age_mask = hn::Set(d16, kHistoryAgeMask);
  const auto up_bit = hn::Set(d16, kHistoryUp);
  const auto one = hn::Set(d16, 1);
  const auto zero = hn::Zero(d16);
  size_t i = 0;
  for (; i + N <= count; i += N) {
    const auto s = hn::LoadU(d16, src + i);
    const auto t = hn::LoadU(d16, dst + i);
    const auto h = hn::PromoteTo(d16, hn::LoadU(d8, history + i));
    // Up: the key difference is below 0x8000, i.e. its top bit is clear.
    const auto step = hn::Sub(MonotoneKeys(d16, t), MonotoneKeys(d16, s));
    const auto up = hn::AndNot(hn::ShiftLeft<3>(hn::ShiftRight<15>(step)), up_bit);
    const auto changed_value = hn::Or(one, up);
    const auto age = hn::And(h, age_mask);
    const auto ageing = hn::And(hn::Ne(age, zero), hn::Ne(age, age_mask));
    const auto aged = hn::IfThenElse(ageing, hn::Or(hn::And(h, up_bit), hn::Add(age, one)), h);
    const auto next = hn::IfThenElse(hn::Ne(s, t), changed_value, aged);
    // Every lane is <= 255: the saturating demotion is exact.
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di16, next)), d8, history + i);
  }
  ref::AdvanceHistory(src + i, dst + i, count - i, history + i);
}

// MonotoneKey and its inverse on u32 lanes holding BF16 patterns: a negative value's
// 16 bits are all flipped, a positive one's sign bit.
template <class D>
hn::Vec<D> KeysOf16(D d, hn::Vec<D> bits) {
  const auto negative = hn::Sub(hn::Zero(d), hn::ShiftRight<15>(bits));  // 0 or ~0
  return hn::Xor(bits, hn::Or(hn::And(negative, hn::Set(d, 0x7FFF)), hn::Set(d, 0x8000)));
}
template <class D>
hn::Vec<D> BitsFromKeys16(D d, hn::Vec<D> keys) {
  const auto positive = hn::Sub(hn::Zero(d), hn::ShiftRight<15>(keys));  // key >= 0x8000
  return hn::Xor(keys, hn::Xor(hn::Set(d, 0xFFFF), hn::And(positive, hn::Set(d, 0x7FFF))));
}

// The bits of a mask, lane 0 = bit 0, for up to 16 lanes. AVX-512 masks are those bits
// already; elsewhere StoreMaskBits writes them as bytes.
template <class D>
HWY_INLINE uint32_t MaskBits16(D d, hn::Mask<D> mask) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  return static_cast<uint32_t>(mask.raw);
#else
  uint8_t bytes[8] = {};
  hn::StoreMaskBits(d, mask, bytes);
  return bytes[0] | (uint32_t{bytes[1]} << 8);
#endif
}

// The entry of a kRansClasses-entry table for each lane's class: a lane permutation
// where a vector holds the whole table (AVX3), else a gather.
template <class D>
HWY_INLINE hn::Vec<D> LookupClass(D d32, const uint32_t* HWY_RESTRICT table, hn::Vec<D> cls) {
  const hn::RebindToSigned<D> di32;
  const size_t N = hn::Lanes(d32);
  if (N == kRansClasses) {
    return hn::TableLookupLanes(hn::LoadU(d32, table), hn::IndicesFromVec(d32, cls));
  }
  if (N * 2 == kRansClasses) {  // AVX2: the two halves of the table
    const auto index = hn::IndicesFromVec(d32, hn::And(cls, hn::Set(d32, N - 1)));
    const auto low = hn::TableLookupLanes(hn::LoadU(d32, table), index);
    const auto high = hn::TableLookupLanes(hn::LoadU(d32, table + N), index);
    return hn::IfThenElse(hn::Lt(cls, hn::Set(d32, static_cast<uint32_t>(N))), low, high);
  }
  return hn::GatherIndex(d32, table, hn::BitCast(di32, cls));
}

// Each lane's class: clamp(exponent field - class_base, 0, kRansClasses - 1).
template <class D>
HWY_INLINE hn::Vec<D> ClassOf(D d32, hn::Vec<D> bits, hn::Vec<D> class_base) {
  const hn::RebindToSigned<D> di32;
  const auto exponent = hn::BitCast(di32, hn::And(hn::ShiftRight<7>(bits), hn::Set(d32, 0xFF)));
  return hn::BitCast(
      d32, hn::Min(hn::Max(hn::Sub(exponent, hn::BitCast(di32, class_base)), hn::Zero(di32)),
                   hn::Set(di32, kRansClasses - 1)));
}

// Each lane's probability and splits: its exponent class's entries, and with a session
// history (at the vector's first element) those of its history class (RansHistoryClass),
// the tables' second or third kRansClasses entries. A template parameter: the kernels
// without a history must not pay for it.
template <bool kWithHistory, class D>
HWY_INLINE void LookupSymbols(D d32, const uint32_t* HWY_RESTRICT probs,
                              const uint32_t* HWY_RESTRICT splits, hn::Vec<D> cls,
                              const uint8_t* HWY_RESTRICT history, hn::Vec<D>* p, hn::Vec<D>* ab) {
  *p = LookupClass(d32, probs, cls);
  *ab = LookupClass(d32, splits, cls);
  if (!kWithHistory) return;
  const hn::Rebind<uint8_t, D> d8;
  const auto h = hn::PromoteTo(d32, hn::LoadU(d8, history));
  const auto recorded = hn::Ne(hn::And(h, hn::Set(d32, kHistoryAgeMask)), hn::Zero(d32));
  const auto went_up = hn::Ne(hn::And(h, hn::Set(d32, kHistoryUp)), hn::Zero(d32));
  const auto up = hn::And(recorded, went_up);
  const auto down = hn::AndNot(went_up, recorded);
  *p = hn::IfThenElse(up, LookupClass(d32, probs + kRansClasses, cls), *p);
  *ab = hn::IfThenElse(up, LookupClass(d32, splits + kRansClasses, cls), *ab);
  *p = hn::IfThenElse(down, LookupClass(d32, probs + 2 * kRansClasses, cls), *p);
  *ab = hn::IfThenElse(down, LookupClass(d32, splits + 2 * kRansClasses, cls), *ab);
}

// kRankBytes[m] byte l = popcount(m & (2^l - 1)): for masks of up to 8 lanes, the number
// of set lanes below each lane.
struct RankBytes {
  uint64_t of[256];
};
constexpr RankBytes MakeRankBytes() {
  RankBytes table{};
  for (int m = 0; m < 256; ++m) {
    uint64_t packed = 0;
    for (int lane = 0; lane < 8; ++lane) {
      int below = 0;
      for (int b = 0; b < lane; ++b) below += (m >> b) & 1;
      packed |= static_cast<uint64_t>(below) << (8 * lane);
    }
    table.of[m] = packed;
  }
  return table;
}
constexpr RankBytes kRankBytes = MakeRankBytes();

// Highway 1.0.3 compresses 32-bit lanes on 4- and 8-lane vectors through an index table
// declared as a non-static constexpr array, which GCC 12 copies onto the stack at every
// call (1 KiB on AVX2, a large share of rANS decoding's time). These are static:
// for each mask, the indices of its set lanes first, then the others.
struct CompressTables {
  uint32_t nibbles8[256];  // 8 lanes: lane l's index in bits 4l..4l+3
  int32_t lanes4[16][4];   // 4 lanes
};
constexpr CompressTables MakeCompressTables() {
  CompressTables table{};
  for (int m = 0; m < 256; ++m) {
    int out = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int lane = 0; lane < 8; ++lane) {
        if (((m >> lane) & 1) != (pass == 0 ? 1 : 0)) continue;
        table.nibbles8[m] |= static_cast<uint32_t>(lane) << (4 * out);
        if (m < 16 && lane < 4) table.lanes4[m][out] = lane;
        ++out;
      }
    }
  }
  return table;
}
constexpr CompressTables kCompressTables = MakeCompressTables();

// hn::Compress(v, mask) for the mask whose bits are `bits` (lane l = bit l): the lanes
// `mask` selects, in order, come first. SVE (whose SVE_256 target has 8 lanes) and
// 16-lane vectors compress natively.
template <class D>
HWY_INLINE hn::Vec<D> CompressLanes(D d32, hn::Vec<D> v, hn::Mask<D> mask, uint32_t bits) {
  constexpr bool kTables = (HWY_TARGET & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)) == 0;
  if constexpr (kTables && hn::MaxLanes(D()) == 8) {
    HWY_ALIGN static constexpr uint32_t kShifts[8] = {0, 4, 8, 12, 16, 20, 24, 28};
    const auto packed = hn::Set(d32, kCompressTables.nibbles8[bits & 0xFF]);
    const auto indices = hn::And(packed >> hn::Load(d32, kShifts), hn::Set(d32, 7));
    return hn::TableLookupLanes(v, hn::IndicesFromVec(d32, indices));
  } else if constexpr (kTables && hn::MaxLanes(D()) == 4) {
    return hn::TableLookupLanes(v, hn::SetTableIndices(d32, kCompressTables.lanes4[bits & 0xF]));
  } else {
    (void)bits;
    return hn::Compress(v, mask);
  }
}

// rank(l) = popcount(mask & (2^l - 1)) for each lane l (up to 16 lanes): a per-lane
// population count where vectors hold 16 lanes (native on AVX3_DL), else a table.
template <class D>
HWY_INLINE hn::Vec<D> RanksBelow(D d32, uint32_t mask) {
  if (hn::Lanes(d32) == kRansLanes) {
    HWY_ALIGN static constexpr uint32_t kBelow[kRansLanes] = {
        0x0,  0x1,   0x3,   0x7,   0xF,   0x1F,   0x3F,   0x7F,
        0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF, 0x3FFF, 0x7FFF};
    return hn::PopulationCount(hn::And(hn::Set(d32, mask), hn::Load(d32, kBelow)));
  }
  const hn::Rebind<uint8_t, D> d8;
  uint8_t bytes[8];
  std::memcpy(bytes, &kRankBytes.of[mask & 0xFF], 8);  // little-endian: byte l is lane l
  return hn::PromoteTo(d32, hn::LoadU(d8, bytes));
}

// a * b for u32 lanes below 2^16: the low and high halves of the 16-bit products (5
// cycles on x86, side by side) instead of a 32-bit multiply (10), which lies on the
// states' dependency chain.
template <class D>
HWY_INLINE hn::Vec<D> MulBelow16(D d32, hn::Vec<D> a, hn::Vec<D> b) {
  const hn::Repartition<uint16_t, D> d16;
  const auto a16 = hn::BitCast(d16, a), b16 = hn::BitCast(d16, b);
  // The upper u16 of each lane is 0 in both, so it is 0 in both products.
  return hn::Or(hn::BitCast(d32, hn::Mul(a16, b16)),
                hn::ShiftLeft<16>(hn::BitCast(d32, hn::MulHigh(a16, b16))));
}

// Decodes lanes [i, i + Lanes(d32)) of one group of kRansLanes elements; `x` holds their
// states. Lanes that renormalise take the next words in lane order, as the reference
// does: while at least a vector's worth of words remains, without branches (each lane
// takes the word at `word` + the number of renormalising lanes below it); near the end
// of the words, lane by lane with a bounds check. Sets *exhausted if the words run out.
template <bool kWithHistory, class D>
HWY_INLINE hn::Vec<D> DecodeRansVector(D d32, hn::Vec<D> x, const uint16_t* HWY_RESTRICT src,
                                       size_t i, hn::Vec<D> class_base,
                                       const uint32_t* HWY_RESTRICT probs,
                                       const uint32_t* HWY_RESTRICT splits,
                                       const uint8_t* HWY_RESTRICT words, size_t num_words,
                                       size_t* HWY_RESTRICT word, uint32_t* HWY_RESTRICT positions,
                                       uint32_t* HWY_RESTRICT xors, size_t* HWY_RESTRICT changes,
                                       bool* exhausted, const uint8_t* HWY_RESTRICT history) {
  const hn::Rebind<uint16_t, D> d16;
  const size_t N = hn::Lanes(d32);
  const auto low = hn::Set(d32, kRansLow);
  const auto bits = hn::PromoteTo(d32, hn::LoadU(d16, src + i));
  const auto cls = ClassOf(d32, bits, class_base);
  hn::Vec<D> p, ab;
  LookupSymbols<kWithHistory>(d32, probs, splits, cls, kWithHistory ? history + i : nullptr, &p,
                              &ab);
  const auto a = hn::And(ab, hn::Set(d32, 0xFFFF));
  const auto b = hn::ShiftRight<16>(ab);
  const auto slot = hn::And(x, hn::Set(d32, 0xFFFF));
  const auto escape = hn::Lt(slot, a);
  const auto up = hn::Lt(slot, b);  // with !escape: d = +1
  const auto changed = hn::Lt(slot, p);
  // (start, frequency) of the decoded symbol.
  const auto start =
      hn::IfThenElse(changed, hn::IfThenElse(up, hn::IfThenZeroElse(escape, a), b), p);
  const auto end =
      hn::IfThenElse(changed, hn::IfThenElse(up, hn::IfThenElse(escape, a, b), p), low);
  x = hn::Add(MulBelow16(d32, hn::Sub(end, start), hn::ShiftRight<16>(x)), hn::Sub(slot, start));
  const auto renormalize = hn::Lt(x, low);
  const uint32_t mask = MaskBits16(d32, renormalize);
  if (*word + N <= num_words) {
    // Lane l takes word `word + rank(l)`, rank(l) = popcount(mask & (2^l - 1)) < N: one
    // contiguous load (off the states' dependency chain) and a lane permutation.
    const auto next_words =
        hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(words + 2 * *word)));
    const auto rank = RanksBelow(d32, mask);
    const auto taken = hn::TableLookupLanes(next_words, hn::IndicesFromVec(d32, rank));
    x = hn::IfThenElse(renormalize, hn::Or(hn::ShiftLeft<16>(x), taken), x);
    *word += static_cast<size_t>(__builtin_popcount(mask));
  } else if (mask != 0) {
    HWY_ALIGN uint32_t lanes[kRansLanes];
    hn::Store(x, d32, lanes);
    for (size_t lane = 0; lane < N; ++lane) {
      if (lanes[lane] >= kRansLow) continue;
      if (*word == num_words) {
        *exhausted = true;
        break;
      }
      lanes[lane] = (lanes[lane] << 16) | words[2 * *word] | (uint32_t{words[2 * *word + 1]} << 8);
      ++*word;
    }
    x = hn::Load(d32, lanes);
  }
  const uint32_t changed_bits = MaskBits16(d32, changed);
  // From 8 lanes on, some lane changes too often at dense changes for a branch to
  // predict: every vector is compressed and stored, which is faster (docs/format_notes.md).
  if (N >= 8 || changed_bits != 0) {
    // The new value of a +-1 step; escapes get 0.
    const auto step = hn::IfThenElse(up, hn::Set(d32, 1), hn::Set(d32, 0xFFFFFFFFu));
    const auto key = hn::And(hn::Add(KeysOf16(d32, bits), step), hn::Set(d32, 0xFFFF));
    const auto xor_bits = hn::IfThenZeroElse(escape, hn::Xor(bits, BitsFromKeys16(d32, key)));
    const auto index = hn::Add(hn::Iota(d32, 0), hn::Set(d32, static_cast<uint32_t>(i)));
    // Compress in registers and store whole vectors (the outputs have room for N more):
    // AVX-512's compress-to-memory is microcoded and slow on AMD Zen 4.
    hn::StoreU(CompressLanes(d32, index, changed, changed_bits), d32, positions + *changes);
    hn::StoreU(CompressLanes(d32, xor_bits, changed, changed_bits), d32, xors + *changes);
    *changes += static_cast<size_t>(__builtin_popcount(changed_bits));
  }
  return x;
}

// Whole groups of kRansLanes elements run on vectors: one holding all the states where
// vectors have kRansLanes u32 lanes (AVX3), two where they have half as many (AVX2),
// else kRansLanes / N vectors kept in memory. The tail (count % kRansLanes elements)
// runs the reference.
template <bool kWithHistory>
size_t DecodeRansChangesOf(const uint16_t* HWY_RESTRICT src, size_t count, int class_base,
                           const uint32_t* HWY_RESTRICT probs, const uint32_t* HWY_RESTRICT splits,
                           uint32_t* HWY_RESTRICT states, const uint8_t* HWY_RESTRICT words,
                           size_t num_words, size_t* HWY_RESTRICT words_used,
                           uint32_t* HWY_RESTRICT positions, uint32_t* HWY_RESTRICT xors,
                           const uint8_t* HWY_RESTRICT history) {
  const hn::CappedTag<uint32_t, kRansLanes> d32;
  const size_t N = hn::Lanes(d32);
  size_t word = *words_used;
  size_t changes = 0;
  bool exhausted = false;
  const auto base = hn::Set(d32, static_cast<uint32_t>(class_base));
  size_t i = 0;
  if (N == kRansLanes) {
    auto x = hn::LoadU(d32, states);
    for (; i + kRansLanes <= count && !exhausted; i += kRansLanes) {
      x = DecodeRansVector<kWithHistory>(d32, x, src, i, base, probs, splits, words, num_words,
                                         &word, positions, xors, &changes, &exhausted, history);
    }
    hn::StoreU(x, d32, states);
  } else if (N * 2 == kRansLanes) {  // AVX2: both halves of the states in registers
    auto low = hn::LoadU(d32, states), high = hn::LoadU(d32, states + N);
    for (; i + kRansLanes <= count && !exhausted; i += kRansLanes) {
      low = DecodeRansVector<kWithHistory>(d32, low, src, i, base, probs, splits, words, num_words,
                                           &word, positions, xors, &changes, &exhausted, history);
      high = DecodeRansVector<kWithHistory>(d32, high, src, i + N, base, probs, splits, words,
                                            num_words, &word, positions, xors, &changes, &exhausted,
                                            history);
    }
    hn::StoreU(low, d32, states);
    hn::StoreU(high, d32, states + N);
  } else {
    for (; i + kRansLanes <= count && !exhausted; i += kRansLanes) {
      for (size_t v = 0; v < kRansLanes; v += N) {
        const auto x = DecodeRansVector<kWithHistory>(
            d32, hn::LoadU(d32, states + v), src, i + v, base, probs, splits, words, num_words,
            &word, positions, xors, &changes, &exhausted, history);
        hn::StoreU(x, d32, states + v);
      }
    }
  }
  if (exhausted) return kRansWordsExhausted;
  // A copy: were `word` itself passed on, its address would escape and it would live in
  // memory in the loop above.
  size_t tail_word = word;
  const size_t tail = ref::DecodeRansChanges(
      src + i, count - i, class_base, probs, splits, states, words, num_words, &tail_word,
      positions + changes, xors + changes, history != nullptr ? history + i : nullptr);
  if (tail == kRansWordsExhausted) return kRansWordsExhausted;
  for (size_t k = changes; k < changes + tail; ++k) positions[k] += static_cast<uint32_t>(i);
  *words_used = tail_word;
  return changes + tail;
}

// One vector of lanes [i, i + Lanes(d32)) of a group, coded after the group's higher
// lanes: symbols from src and dst, renormalisation (the emitting lanes' words pushed in
// descending lane order, as the reference pushes them), then x / frequency through f32:
// the quotient is below 2^16 and the f32 estimate within one of it, so one integer
// correction each way makes it exact.
template <bool kWithHistory, class D>
HWY_INLINE hn::Vec<D> EncodeRansVector(D d32, hn::Vec<D> x, const uint16_t* HWY_RESTRICT src,
                                       const uint16_t* HWY_RESTRICT dst, size_t i,
                                       hn::Vec<D> class_base, const uint32_t* HWY_RESTRICT probs,
                                       const uint32_t* HWY_RESTRICT splits,
                                       uint16_t* HWY_RESTRICT pushed, size_t* num_pushed,
                                       const uint8_t* HWY_RESTRICT history) {
  const hn::Rebind<uint16_t, D> d16;
  const hn::RebindToSigned<D> di32;
  const hn::Rebind<float, D> df;
  const size_t N = hn::Lanes(d32);
  const auto low = hn::Set(d32, kRansLow);
  const auto bits = hn::PromoteTo(d32, hn::LoadU(d16, src + i));
  const auto target = hn::PromoteTo(d32, hn::LoadU(d16, dst + i));
  const auto cls = ClassOf(d32, bits, class_base);
  hn::Vec<D> p, ab;
  LookupSymbols<kWithHistory>(d32, probs, splits, cls, kWithHistory ? history + i : nullptr, &p,
                              &ab);
  const auto a = hn::And(ab, hn::Set(d32, 0xFFFF));
  const auto b = hn::ShiftRight<16>(ab);
  const auto step =
      hn::And(hn::Sub(KeysOf16(d32, target), KeysOf16(d32, bits)), hn::Set(d32, 0xFFFF));
  const auto unchanged = hn::Eq(step, hn::Zero(d32));
  const auto up = hn::Eq(step, hn::Set(d32, 1));
  const auto down = hn::Eq(step, hn::Set(d32, 0xFFFF));
  // (start, end) of the symbol: unchanged [p, 2^16), +1 [a, b), -1 [b, p), escape [0, a).
  const auto start =
      hn::IfThenElse(unchanged, p, hn::IfThenElse(up, a, hn::IfThenElse(down, b, hn::Zero(d32))));
  const auto end =
      hn::IfThenElse(unchanged, low, hn::IfThenElse(up, b, hn::IfThenElse(down, p, a)));
  const auto freq = hn::Sub(end, start);
  const auto emit = hn::Not(hn::Lt(x, hn::ShiftLeft<16>(freq)));
  if (HWY_UNLIKELY(!hn::AllFalse(d32, emit))) {
    HWY_ALIGN uint32_t lanes[kRansLanes];
    hn::Store(x, d32, lanes);
    const uint32_t mask = MaskBits16(d32, emit);
    for (size_t lane = N; lane-- > 0;) {
      if (mask & (1u << lane)) pushed[(*num_pushed)++] = static_cast<uint16_t>(lanes[lane]);
    }
    x = hn::IfThenElse(emit, hn::ShiftRight<16>(x), x);
  }
  const auto x_float = hn::Add(
      hn::Mul(hn::ConvertTo(df, hn::BitCast(di32, hn::ShiftRight<16>(x))), hn::Set(df, 65536.0f)),
      hn::ConvertTo(df, hn::BitCast(di32, hn::And(x, hn::Set(d32, 0xFFFF)))));
  const auto freq_float = hn::ConvertTo(df, hn::BitCast(di32, freq));
  auto q = hn::BitCast(d32, hn::ConvertTo(di32, hn::Div(x_float, freq_float)));
  auto r = hn::BitCast(di32, hn::Sub(x, hn::Mul(q, freq)));
  const auto too_big = hn::RebindMask(d32, hn::Lt(r, hn::Zero(di32)));
  q = hn::IfThenElse(too_big, hn::Sub(q, hn::Set(d32, 1)), q);
  r = hn::IfThenElse(hn::RebindMask(di32, too_big), hn::Add(r, hn::BitCast(di32, freq)), r);
  const auto too_small = hn::RebindMask(d32, hn::Not(hn::Lt(r, hn::BitCast(di32, freq))));
  q = hn::IfThenElse(too_small, hn::Add(q, hn::Set(d32, 1)), q);
  r = hn::IfThenElse(hn::RebindMask(di32, too_small), hn::Sub(r, hn::BitCast(di32, freq)), r);
  return hn::Add(hn::Add(hn::ShiftLeft<16>(q), hn::BitCast(d32, r)), start);
}

// The tail (count % kRansLanes elements, coded first) runs the reference; then whole
// groups from the last, their vectors from the highest lanes down.
template <bool kWithHistory>
size_t EncodeRansElementsOf(const uint16_t* HWY_RESTRICT src, const uint16_t* HWY_RESTRICT dst,
                            size_t count, int class_base, const uint32_t* HWY_RESTRICT probs,
                            const uint32_t* HWY_RESTRICT splits, uint32_t* HWY_RESTRICT states,
                            uint16_t* HWY_RESTRICT pushed, const uint8_t* HWY_RESTRICT history) {
  const hn::CappedTag<uint32_t, kRansLanes> d32;
  const size_t N = hn::Lanes(d32);
  const size_t groups_end = count / kRansLanes * kRansLanes;
  size_t num_pushed = ref::EncodeRansElements(
      src + groups_end, dst + groups_end, count - groups_end, class_base, probs, splits, states,
      pushed, history != nullptr ? history + groups_end : nullptr);
  const auto base = hn::Set(d32, static_cast<uint32_t>(class_base));
  if (N == kRansLanes) {
    auto x = hn::LoadU(d32, states);
    for (size_t i = groups_end; i > 0;) {
      i -= kRansLanes;
      x = EncodeRansVector<kWithHistory>(d32, x, src, dst, i, base, probs, splits, pushed,
                                         &num_pushed, history);
    }
    hn::StoreU(x, d32, states);
  } else if (N * 2 == kRansLanes) {  // AVX2: both halves of the states in registers
    auto low = hn::LoadU(d32, states), high = hn::LoadU(d32, states + N);
    for (size_t i = groups_end; i > 0;) {
      i -= kRansLanes;
      high = EncodeRansVector<kWithHistory>(d32, high, src, dst, i + N, base, probs, splits, pushed,
                                            &num_pushed, history);
      low = EncodeRansVector<kWithHistory>(d32, low, src, dst, i, base, probs, splits, pushed,
                                           &num_pushed, history);
    }
    hn::StoreU(low, d32, states);
    hn::StoreU(high, d32, states + N);
  } else {
    for (size_t i = groups_end; i > 0;) {
      i -= kRansLanes;
      for (size_t v = kRansLanes; v > 0;) {
        v -= N;
        const auto x =
            EncodeRansVector<kWithHistory>(d32, hn::LoadU(d32, states + v), src, dst, i + v, base,
                                           probs, splits, pushed, &num_pushed, history);
        hn::StoreU(x, d32, states + v);
      }
    }
  }
  return num_pushed;
}

size_t DecodeRansChanges(const uint16_t* HWY_RESTRICT src, size_t count, int class_base,
                         const uint32_t* HWY_RESTRICT probs, const uint32_t* HWY_RESTRICT splits,
                         uint32_t* HWY_RESTRICT states, const uint8_t* HWY_RESTRICT words,
                         size_t num_words, size_t* HWY_RESTRICT words_used,
                         uint32_t* HWY_RESTRICT positions, uint32_t* HWY_RESTRICT xors,
                         const uint8_t* HWY_RESTRICT history) {
  return history != nullptr
             ? DecodeRansChangesOf<true>(src, count, class_base, probs, splits, states, words,
                                         num_words, words_used, positions, xors, history)
             : DecodeRansChangesOf<false>(src, count, class_base, probs, splits, states, words,
                                          num_words, words_used, positions, xors, nullptr);
}

size_t EncodeRansElements(const uint16_t* HWY_RESTRICT src, const uint16_t* HWY_RESTRICT dst,
                          size_t count, int class_base, const uint32_t* HWY_RESTRICT probs,
                          const uint32_t* HWY_RESTRICT splits, uint32_t* HWY_RESTRICT states,
                          uint16_t* HWY_RESTRICT pushed, const uint8_t* HWY_RESTRICT history) {
  return history != nullptr ? EncodeRansElementsOf<true>(src, dst, count, class_base, probs, splits,
                                                         states, pushed, history)
                            : EncodeRansElementsOf<false>(src, dst, count, class_base, probs,
                                                          splits, states, pushed, nullptr);
}

int64_t TargetId() { return HWY_TARGET; }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace arc_v3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace arc_v3 {

HWY_EXPORT(ClassifyChanges);
HWY_EXPORT(CompactChanges);
HWY_EXPORT(PackMantissas);
HWY_EXPORT(UnpackMantissas);
HWY_EXPORT(ApplyXor);
HWY_EXPORT(GroupRateSums);
HWY_EXPORT(HistoryRateSums);
HWY_EXPORT(RecentPositions);
HWY_EXPORT(AdvanceHistory);
HWY_EXPORT(DecodeRansChanges);
HWY_EXPORT(EncodeRansElements);
HWY_EXPORT(TargetId);

ChangeCounts ClassifyChanges(const uint16_t* src, const uint16_t* dst, size_t count) {
  return HWY_DYNAMIC_DISPATCH(ClassifyChanges)(src, dst, count);
}

size_t CompactChanges(const uint16_t* src, const uint16_t* dst, size_t count, uint32_t* positions,
                      uint16_t* xors) {
  return HWY_DYNAMIC_DISPATCH(CompactChanges)(src, dst, count, positions, xors);
}

void PackMantissas(const uint16_t* xors, size_t count, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(PackMantissas)(xors, count, out);
}

void UnpackMantissas(const uint8_t* packed, size_t count, uint16_t* xors) {
  HWY_DYNAMIC_DISPATCH(UnpackMantissas)(packed, count, xors);
}

void ApplyXor(const uint16_t* src, const uint16_t* xors, size_t count, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(ApplyXor)(src, xors, count, out);
}

int GroupRateSums(const uint16_t* src, size_t groups, int rate_cap, uint64_t* sums) {
  return HWY_DYNAMIC_DISPATCH(GroupRateSums)(src, groups, rate_cap, sums);
}

void HistoryRateSums(const uint16_t* src, const uint8_t* history, const int8_t boosts[8],
                     size_t groups, int rate_cap, uint64_t* sums) {
  HWY_DYNAMIC_DISPATCH(HistoryRateSums)(src, history, boosts, groups, rate_cap, sums);
}

size_t RecentPositions(const uint8_t* history, size_t count, uint32_t* positions) {
  return HWY_DYNAMIC_DISPATCH(RecentPositions)(history, count, positions);
}

void AdvanceHistory(const uint16_t* src, const uint16_t* dst, size_t count, uint8_t* history) {
  HWY_DYNAMIC_DISPATCH(AdvanceHistory)(src, dst, count, history);
}

size_t DecodeRansChanges(const uint16_t* src, size_t count, int class_base, const uint32_t* probs,
                         const uint32_t* splits, uint32_t states[kRansLanes], const uint8_t* words,
                         size_t num_words, size_t* words_used, uint32_t* positions, uint32_t* xors,
                         const uint8_t* history) {
  return HWY_DYNAMIC_DISPATCH(DecodeRansChanges)(src, count, class_base, probs, splits, states,
                                                 words, num_words, words_used, positions, xors,
                                                 history);
}

size_t EncodeRansElements(const uint16_t* src, const uint16_t* dst, size_t count, int class_base,
                          const uint32_t* probs, const uint32_t* splits,
                          uint32_t states[kRansLanes], uint16_t* pushed, const uint8_t* history) {
  return HWY_DYNAMIC_DISPATCH(EncodeRansElements)(src, dst, count, class_base, probs, splits,
                                                  states, pushed, history);
}

const char* DispatchedTargetName() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetId)()); }

}  // namespace arc_v3
#endif  // HWY_ONCE

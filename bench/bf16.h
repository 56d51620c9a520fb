// BF16 bit-pattern helpers shared by the benchmark, its generator and its statistics.
// BF16 bit layout (uint16_t): s eeeeeeee mmmmmmm.
#ifndef ARC_V3_BENCH_BF16_H_
#define ARC_V3_BENCH_BF16_H_

#include <cstdint>
#include <cstring>

namespace arc_v3 {
namespace bench {

// Position of a BF16 bit pattern in the monotone integer order: sign-magnitude mapped so
// that comparing keys compares values (-0 -> -1, +0 -> 0). d = key(next) - key(prev) is
// the "number of representable steps" a weight moved.
inline int32_t MonotoneKey(uint16_t bits) {
  return bits < 0x8000 ? static_cast<int32_t>(bits) : 0x7FFF - static_cast<int32_t>(bits);
}

// Exponent field (0..255) of a BF16 bit pattern.
inline int ExponentField(uint16_t bits) { return (bits >> 7) & 0xFF; }

// FP32 -> BF16 with round-to-nearest-even (the cast PyTorch applies); finite inputs.
inline uint16_t Bf16FromFloat(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_BF16_H_

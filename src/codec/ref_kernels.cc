// Reference kernels: plain C++, the definition every SIMD target must match byte for
// byte. Also used for the tails that are shorter than a vector.
#include <algorithm>
#include <cstring>

#include "src/codec/kernels.h"

namespace arc_v3 {
namespace ref {

ChangeCounts ClassifyChanges(const uint16_t* src, const uint16_t* dst, size_t count) {
  ChangeCounts counts;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t x = src[i] ^ dst[i];
    counts.changed += (x != 0);
    counts.high += (x & kHighFieldMask) != 0;
  }
  return counts;
}

size_t CompactChanges(const uint16_t* src, const uint16_t* dst, size_t count, uint32_t* positions,
                      uint16_t* xors) {
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t x = src[i] ^ dst[i];
    if (x != 0) {
      positions[n] = static_cast<uint32_t>(i);
      xors[n] = x;
      ++n;
    }
  }
  return n;
}

void PackMantissas(const uint16_t* xors, size_t count, uint8_t* out) {
  uint32_t bits = 0;  // pending bits, LSB first
  int num_bits = 0;
  size_t pos = 0;
  for (size_t k = 0; k < count; ++k) {
    bits |= static_cast<uint32_t>(xors[k] & kMantissaMask) << num_bits;
    num_bits += 7;
    while (num_bits >= 8) {
      out[pos++] = static_cast<uint8_t>(bits);
      bits >>= 8;
      num_bits -= 8;
    }
  }
  if (num_bits > 0) out[pos] = static_cast<uint8_t>(bits);
}

void UnpackMantissas(const uint8_t* packed, size_t count, uint16_t* xors) {
  uint32_t bits = 0;
  int num_bits = 0;
  size_t pos = 0;
  for (size_t k = 0; k < count; ++k) {
    if (num_bits < 7) {
      bits |= static_cast<uint32_t>(packed[pos++]) << num_bits;
      num_bits += 8;
    }
    xors[k] = static_cast<uint16_t>(bits & kMantissaMask);
    bits >>= 7;
    num_bits -= 7;
  }
}

void ApplyXor(const uint16_t* src, const uint16_t* xors, size_t count, uint16_t* out) {
  for (size_t i = 0; i < count; ++i) out[i] = src[i] ^ xors[i];
}

int GroupRateSums(const uint16_t* src, size_t groups, int rate_cap, uint64_t* sums) {
  int largest = 0;
  for (size_t g = 0; g < groups; ++g) {
    uint64_t sum = 0;
    for (size_t i = 4 * g; i < 4 * g + 4; ++i) {
      const int exponent = (src[i] >> 7) & 0xFF;
      const int rate_log = std::min(std::max(kRateTopExponent - exponent, 0), kMaxRateLog);
      largest = std::max(largest, rate_log);
      sum += uint64_t{1} << std::min(rate_log, rate_cap);
    }
    sums[g] = sum;
  }
  return largest;
}

void HistoryRateSums(const uint16_t* src, const uint8_t* history, const int8_t boosts[8],
                     size_t groups, int rate_cap, uint64_t* sums) {
  for (size_t g = 0; g < groups; ++g) {
    uint64_t sum = 0;
    for (size_t i = 4 * g; i < 4 * g + 4; ++i) {
      const int exponent = (src[i] >> 7) & 0xFF;
      const int rate_log = std::min(std::max(kRateTopExponent - exponent, 0), rate_cap) +
                           boosts[history[i] & kHistoryAgeMask];
      sum += uint64_t{1} << std::min(std::max(rate_log, 0), rate_cap);
    }
    sums[g] = sum;
  }
}

size_t RecentPositions(const uint8_t* history, size_t count, uint32_t* positions) {
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    if (IsRecent(history[i])) positions[n++] = static_cast<uint32_t>(i);
  }
  return n;
}

void AdvanceHistory(const uint16_t* src, const uint16_t* dst, size_t count, uint8_t* history) {
  for (size_t i = 0; i < count; ++i) {
    const uint8_t age = history[i] & kHistoryAgeMask;
    if (src[i] != dst[i]) {
      const bool up = static_cast<uint16_t>(MonotoneKey(dst[i]) - MonotoneKey(src[i])) < 0x8000;
      history[i] = static_cast<uint8_t>(1 | (up ? kHistoryUp : 0));
    } else if (age != 0 && age != kHistoryAgeMask) {
      history[i] = static_cast<uint8_t>((history[i] & kHistoryUp) | (age + 1));
    }
  }
}

size_t DecodeRansChanges(const uint16_t* src, size_t count, int class_base, const uint32_t* probs,
                         const uint32_t* splits, uint32_t states[kRansLanes], const uint8_t* words,
                         size_t num_words, size_t* words_used, uint32_t* positions, uint32_t* xors,
                         const uint8_t* history) {
  size_t changes = 0;
  size_t word = *words_used;
  for (size_t i = 0; i < count; ++i) {
    uint32_t& x = states[i % kRansLanes];
    const int c = std::min(std::max(((src[i] >> 7) & 0xFF) - class_base, 0), kRansClasses - 1) +
                  (history != nullptr ? kRansClasses * RansHistoryClass(history[i]) : 0);
    const uint32_t p = probs[c], a = splits[c] & 0xFFFF, b = splits[c] >> 16;
    const uint32_t slot = x & 0xFFFF;
    uint32_t start, freq;
    if (slot < a) {
      start = 0, freq = a;
    } else if (slot < b) {
      start = a, freq = b - a;
    } else if (slot < p) {
      start = b, freq = p - b;
    } else {
      start = p, freq = kRansLow - p;
    }
    x = freq * (x >> 16) + slot - start;
    if (x < kRansLow) {
      if (word == num_words) return kRansWordsExhausted;
      x = (x << 16) | words[2 * word] | (uint32_t{words[2 * word + 1]} << 8);
      ++word;
    }
    if (slot < p) {
      const uint16_t key = static_cast<uint16_t>(MonotoneKey(src[i]) + (slot < b ? 1 : -1));
      positions[changes] = static_cast<uint32_t>(i);
      xors[changes] = slot < a ? 0 : static_cast<uint32_t>(src[i] ^ FromMonotoneKey(key));
      ++changes;
    }
  }
  *words_used = word;
  return changes;
}

size_t EncodeRansElements(const uint16_t* src, const uint16_t* dst, size_t count, int class_base,
                          const uint32_t* probs, const uint32_t* splits,
                          uint32_t states[kRansLanes], uint16_t* pushed, const uint8_t* history) {
  size_t num_pushed = 0;
  for (size_t i = count; i-- > 0;) {
    uint32_t& x = states[i % kRansLanes];
    const int c = std::min(std::max(((src[i] >> 7) & 0xFF) - class_base, 0), kRansClasses - 1) +
                  (history != nullptr ? kRansClasses * RansHistoryClass(history[i]) : 0);
    const uint32_t p = probs[c], a = splits[c] & 0xFFFF, b = splits[c] >> 16;
    const uint16_t step = static_cast<uint16_t>(MonotoneKey(dst[i]) - MonotoneKey(src[i]));
    uint32_t start, freq;
    if (step == 0) {
      start = p, freq = kRansLow - p;
    } else if (step == 1) {
      start = a, freq = b - a;
    } else if (step == 0xFFFF) {
      start = b, freq = p - b;
    } else {
      start = 0, freq = a;
    }
    if (x >= (freq << 16)) {
      pushed[num_pushed++] = static_cast<uint16_t>(x);
      x >>= 16;
    }
    x = ((x / freq) << 16) + x % freq + start;
  }
  return num_pushed;
}

}  // namespace ref
}  // namespace arc_v3

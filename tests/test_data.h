// Small BF16 delta makers for codec tests: weight-like values with sparse updates of a
// chosen density and class mix, plus the odd values (NaN payloads, +-Inf, denormals, -0)
// that must round-trip exactly. Realistic optimizer dynamics live in //bench:generator.
#ifndef ARC_V3_TESTS_TEST_DATA_H_
#define ARC_V3_TESTS_TEST_DATA_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace arc_v3 {
namespace test {

inline uint16_t Bf16FromFloat(float f) {  // round to nearest even (finite inputs)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float FloatFromBf16(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Mix {
  double density = 0.01;  // fraction of elements that change
  double high = 0.015;    // of the changes: exponent changes
  double sign = 0.001;    // of the changes: sign flips
};

// Weights ~ N(0, 0.02); changed elements move by a few ULPs, some across an exponent
// boundary or through zero, as optimizer steps do.
inline void MakeDelta(size_t n, const Mix& mix, uint32_t seed, std::vector<uint16_t>* src,
                      std::vector<uint16_t>* dst) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> weight(0.0f, 0.02f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  src->resize(n);
  dst->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t s = Bf16FromFloat(weight(rng));
    uint16_t d = s;
    if (uniform(rng) < mix.density) {
      const double kind = uniform(rng);
      if (kind < mix.sign) {
        d = s ^ 0x8000;
      } else if (kind < mix.sign + mix.high) {
        d = static_cast<uint16_t>(s ^ (0x0080 << (rng() % 2)) ^ (rng() & 0x7F));
      } else {
        const int step = 1 + static_cast<int>(rng() % 3);
        d = static_cast<uint16_t>((s & 0xFF80) | ((s + (rng() & 1 ? step : -step)) & 0x7F));
      }
      if (d == s) d = s ^ 1;
    }
    (*src)[i] = s;
    (*dst)[i] = d;
  }
}

// Weights ~ N(0, 0.02) as BF16.
inline std::vector<uint16_t> GaussianWeights(size_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> w(n);
  for (auto& x : w) x = Bf16FromFloat(normal(*rng));
  return w;
}

// A small optimiser step: every weight moves by about `lr` (same size for every weight,
// as Adam's normalised update does), and the result is rounded to BF16. So a weight's
// chance to change halves with each step up of its exponent, as in real runs.
inline std::vector<uint16_t> Step(const std::vector<uint16_t>& w, float lr, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> next(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    next[i] = Bf16FromFloat(FloatFromBf16(w[i]) + lr * normal(*rng));
  }
  return next;
}

// A step of a weight matrix with rows of `cols` elements in which about `density` of the
// elements move by one ULP, each in its column's direction with probability `agree` (an
// output layer's updates share the sign of their input feature), else the other way.
inline std::vector<uint16_t> ColumnCoherentStep(const std::vector<uint16_t>& w, size_t cols,
                                                double density, double agree, std::mt19937* rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int> column_up(cols);
  for (int& up : column_up) up = uniform(*rng) < 0.5;
  std::vector<uint16_t> next = w;
  for (size_t i = 0; i < w.size(); ++i) {
    if (uniform(*rng) >= density || (w[i] & 0x7FFF) == 0) continue;
    const bool up = (uniform(*rng) < agree) == (column_up[i % cols] != 0);
    // One ULP towards +inf or -inf: the magnitude grows with the sign's direction.
    const bool grows = up == ((w[i] & 0x8000) == 0);
    next[i] = static_cast<uint16_t>(grows ? w[i] + 1 : w[i] - 1);
  }
  return next;
}

// Damaged copies of a valid chunk for decoder robustness tests: calls check(bytes, size)
// on every truncation of `good`, on `good` with each of its bits flipped in turn, and on
// 200 arbitrary byte strings of 1 to max_junk bytes.
template <class Check>
void ForEachDamagedChunk(const std::vector<uint8_t>& good, size_t max_junk, std::mt19937* rng,
                         const Check& check) {
  for (size_t size = 0; size < good.size(); ++size) check(good.data(), size);
  std::vector<uint8_t> flipped = good;
  for (size_t bit = 0; bit < 8 * good.size(); ++bit) {
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    check(flipped.data(), flipped.size());
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> junk(1 + trial % max_junk);
    for (auto& b : junk) b = static_cast<uint8_t>(byte(*rng));
    check(junk.data(), junk.size());
  }
}

// Every interesting special BF16 value.
inline std::vector<uint16_t> SpecialValues() {
  return {0x0000, 0x8000,                  // +-0
          0x0001, 0x8001, 0x007F, 0x807F,  // denormals
          0x0080, 0x8080,                  // smallest normals
          0x7F7F, 0xFF7F,                  // largest finite
          0x7F80, 0xFF80,                  // +-Inf
          0x7FC0, 0xFFC0, 0x7F81, 0xFFFF,  // NaNs, quiet and signalling, with payloads
          0x3F80, 0xBF80};                 // +-1
}

}  // namespace test
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_TEST_DATA_H_

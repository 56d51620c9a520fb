// Test cases that hold for every chunk coder (model_coder.h, rans_coder.h), written once
// and run by each coder's suite (model_coder_test.cc, rans_coder_test.cc) with its own
// round-trip and sanity checks.
#ifndef ARC_V3_TESTS_CODEC_CHUNK_CODER_CASES_H_
#define ARC_V3_TESTS_CODEC_CHUNK_CODER_CASES_H_

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/test_data.h"

namespace arc_v3 {
namespace chunk_coder_cases {

// What the shared cases need of a coder's suite.
struct ChunkCoder {
  // Encodes src -> dst (at least one change) in every configuration the coder has, checks
  // each round trip and determinism; returns the bytes of the default configuration.
  std::vector<uint8_t> (*round_trips)(const std::vector<uint16_t>& src,
                                      const std::vector<uint16_t>& dst);
  // Decodes untrusted bytes against src and checks that the result is an error with empty
  // outputs or well-formed.
  void (*check_sane)(const std::vector<uint16_t>& src, const uint8_t* bytes, size_t size);
  // CheckDamagedChunks' max_junk (test::ForEachDamagedChunk).
  size_t max_junk;
};

// Everything changed: arbitrary bit patterns, every sign flipped, every bit flipped.
inline void CheckEverythingChanged(const ChunkCoder& coder) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF);
  for (size_t n : {1, 17, 1000, 4099}) {
    std::vector<uint16_t> src(n), dst(n);
    for (size_t i = 0; i < n; ++i) {
      src[i] = static_cast<uint16_t>(any(rng));
      do {
        dst[i] = static_cast<uint16_t>(any(rng));
      } while (dst[i] == src[i]);
    }
    coder.round_trips(src, dst);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] ^ 0x8000;  // every sign flipped
    coder.round_trips(src, dst);
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint16_t>(~src[i]);  // every bit
    coder.round_trips(src, dst);
  }
}

// Every transition between special values (+-0, denormals, +-Inf, NaNs, the exponent
// carry around +-1), then the extreme monotone steps.
inline void CheckSpecialValues(const ChunkCoder& coder) {
  std::vector<uint16_t> specials = test::SpecialValues();
  specials.push_back(0x3F7F);  // just below +1: the carry into the exponent
  specials.push_back(0xBF7F);  // and on the negative side
  std::vector<uint16_t> src, dst;
  for (uint16_t a : specials) {
    for (uint16_t b : specials) {
      src.push_back(a);
      dst.push_back(b);
    }
  }
  coder.round_trips(src, dst);
  // Steps of -32768 (the one step with two spellings, coded as negative), +32767 and
  // one short of a full wrap, in every exponent class.
  src = {0x0000, 0x8000, 0x7FFF, 0xFFFF, 0x1234, 0x3F80, 0x0080};
  dst = {0xFFFF, 0x7FFF, 0x8000, 0x0000, 0x9234, 0xBF80, 0x8080};
  coder.round_trips(src, dst);
}

// Truncated, bit-flipped and arbitrary bytes, and a wrong base, give an error or a
// well-formed result, never a crash.
inline void CheckDamagedChunks(const ChunkCoder& coder) {
  std::mt19937 rng(5);
  for (size_t n : {1, 40, 300}) {
    const std::vector<uint16_t> src = test::GaussianWeights(n, &rng);
    std::vector<uint16_t> dst = test::Step(src, 5e-4f, &rng);
    dst[n / 2] ^= 0x8001;  // at least one change, one with a large step
    const std::vector<uint8_t> good = coder.round_trips(src, dst);
    test::ForEachDamagedChunk(good, coder.max_junk, &rng, [&](const uint8_t* bytes, size_t size) {
      coder.check_sane(src, bytes, size);
    });
    // Another base predicts other probabilities: a wrong result or an error, no crash.
    coder.check_sane(test::GaussianWeights(n, &rng), good.data(), good.size());
  }
}

}  // namespace chunk_coder_cases
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_CODEC_CHUNK_CODER_CASES_H_

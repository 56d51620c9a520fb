// Shared pieces of the fuzz targets (tests/fuzz/README.md): a fatal check that works the
// same under libFuzzer and in the corpus replay test, the fixed base tensor the decoder
// targets decode against, and a byte consumer for building structured inputs.
//
// Each target defines `int Fuzz<Name>(const uint8_t*, size_t)` and, unless
// ARC_V3_FUZZ_NO_ENTRY is defined (the replay test links every target into one binary),
// the libFuzzer entry point LLVMFuzzerTestOneInput calling it.
#ifndef ARC_V3_TESTS_FUZZ_FUZZ_COMMON_H_
#define ARC_V3_TESTS_FUZZ_FUZZ_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "arc_v3.hpp"

// A violated promise is a crash: libFuzzer then saves the input as a reproducer.
#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

#ifdef ARC_V3_FUZZ_NO_ENTRY
#define ARC_V3_FUZZ_ENTRY(func)
#else
#define ARC_V3_FUZZ_ENTRY(func)                                             \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return func(data, size);                                                \
  }
#endif

namespace arc_v3 {
namespace fuzz {

// Deterministic weight-like BF16 values (exponents around 2^-6, a few special values),
// so that the modelled coder's exponent contexts vary as they do on real weights.
inline uint16_t BaseValue(uint64_t i) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  if ((h & 0x3FF) == 0) {  // rare odd values: +-0, +-Inf, NaN, denormal
    static const uint16_t kOdd[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001};
    return kOdd[(h >> 10) % 6];
  }
  const uint16_t sign = static_cast<uint16_t>((h >> 16) & 1) << 15;
  // Exponent 118..125 with a geometric-ish tilt towards the middle.
  const uint16_t exponent =
      static_cast<uint16_t>(118 + ((h >> 17) & 3) + ((h >> 19) & 3) + ((h >> 21) & 1));
  return static_cast<uint16_t>(sign | (exponent << 7) | ((h >> 24) & 0x7F));
}

inline std::vector<uint16_t> MakeBase(size_t n) {
  std::vector<uint16_t> base(n);
  for (size_t i = 0; i < n; ++i) base[i] = BaseValue(i);
  return base;
}

// The step a primed session has decoded before it meets the fuzz input (fuzz_decode.cc,
// make_seeds.cc): from this base to MakeBase(n), so that a payload continuing that step
// is decoded against the fixed base with the step's history and carried
// models. Every 29th element differs in its lowest mantissa bit: sparse enough that the
// step's chunks are modelled.
inline std::vector<uint16_t> MakePrimingBase(size_t n) {
  std::vector<uint16_t> base = MakeBase(n);
  for (size_t i = 3; i < n; i += 29) base[i] ^= 1;
  return base;
}

// How the seeds' and the primed sessions' groups split n elements: a third, an empty
// tensor, the rest.
inline std::vector<uint64_t> GroupSplit(size_t n) { return {n / 3, 0, n - n / 3}; }

// `src` and `second` (dst or out) of a group cut by GroupSplit, back to back.
template <class Tensor, class Second>
std::vector<Tensor> GroupViews(size_t n, const uint16_t* src, Second second) {
  std::vector<Tensor> tensors;
  size_t at = 0;
  for (const uint64_t count : GroupSplit(n)) {
    tensors.push_back({src + at, second + at, static_cast<size_t>(count)});
    at += static_cast<size_t>(count);
  }
  return tensors;
}

// The options the decode seeds and the priming step are coded with.
inline Options SeedOptions() {
  Options options;
  options.chunk_elements = 1024;
  options.threads = 1;
  return options;
}
// One session step before -> after of n elements through `sender`: one tensor, or a group
// cut by GroupSplit.
inline Status CompressSessionStep(const uint16_t* before, const uint16_t* after, size_t n,
                                  bool group, Session* sender, Delta* delta) {
  if (!group) return sender->Compress(before, after, n, delta);
  const std::vector<TensorDelta> tensors = GroupViews<TensorDelta>(n, before, after);
  return sender->CompressTensors(tensors.data(), tensors.size(), delta);
}

// The priming step, coded by `sender` (created with SeedOptions, fresh).
inline void CompressPrimingStep(size_t n, bool group, Session* sender, Delta* delta) {
  const std::vector<uint16_t> before = MakePrimingBase(n), after = MakeBase(n);
  FUZZ_CHECK(CompressSessionStep(before.data(), after.data(), n, group, sender, delta).ok(),
             "priming step");
}

// Reads fields off the front of the input; past its end every read yields 0.
class Consumer {
 public:
  Consumer(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t remaining() const { return size_ - pos_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() {
    const uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | (Byte() << 8));
  }
  uint32_t U32() {
    const uint32_t lo = U16();
    return lo | (uint32_t{U16()} << 16);
  }
  const uint8_t* Rest(size_t* size) {
    *size = remaining();
    const uint8_t* rest = data_ + pos_;
    pos_ = size_;
    return rest;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace fuzz
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_FUZZ_FUZZ_COMMON_H_

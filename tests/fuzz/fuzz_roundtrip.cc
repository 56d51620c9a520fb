// Fuzz target: round trips of fuzzer-built (src, dst) pairs through every format, effort
// and chunk size. Promises checked: decoding gives dst exactly (out of place and in
// place), compressing twice and with another thread count gives the same bytes, and the
// bytes are the same on every SIMD target compiled in (src/codec/FORMAT.md, "Conventions": the
// payload does not depend on the target).
//
// Input: an options byte, a data-mode byte, a length, then data:
// - mode 0 ("edits"): src is the fixed base; the rest is a list of 3-byte edits
//   (skip, kind+payload) giving sparse, realistic or odd changes;
// - mode 1 ("raw"): the rest is interleaved (src, dst) u16 pairs, e.g. special values.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arc_v3.hpp"
#include "hwy/targets.h"
#include "src/codec/model_coder.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

constexpr size_t kMaxElements = size_t{1} << 14;  // keeps runs fast; 1K chunks: up to 16

void BuildPair(Consumer* in, std::vector<uint16_t>* src, std::vector<uint16_t>* dst) {
  const uint8_t mode = in->Byte() & 1;
  size_t n = in->U16() % (kMaxElements + 1);
  // Tensors grow with the input (64 elements per byte of edits): small inputs run fast,
  // and libFuzzer lengthens inputs as it goes, so large tensors come too.
  n = std::min(n, 64 * (in->remaining() + 1));
  if (mode == 1) {
    n = std::min(n, in->remaining() / 4);
    src->resize(n);
    dst->resize(n);
    for (size_t i = 0; i < n; ++i) {
      (*src)[i] = in->U16();
      (*dst)[i] = in->U16();
    }
    return;
  }
  *src = MakeBase(n);
  *dst = *src;
  size_t i = 0;
  while (in->remaining() >= 3 && n > 0) {
    const uint8_t skip = in->Byte();
    const uint8_t kind = in->Byte();
    const uint8_t arg = in->Byte();
    // Skips of up to 64 * 255 reach the far chunks of the largest inputs.
    i += (kind & 0x80) ? size_t{skip} * 64 : skip;
    if (i >= n) break;
    const uint16_t s = (*src)[i];
    uint16_t d = s;
    switch (kind & 0x7) {
      case 0:  // +-steps in value order, across exponents and zero
      case 1:
      case 2: {
        const int step = 1 + (arg & 0x3F);
        const int key = MonotoneKey(s) + ((arg & 0x40) ? step : -step);
        d = FromMonotoneKey(static_cast<uint16_t>(key));
        break;
      }
      case 3: d = static_cast<uint16_t>(s ^ arg ^ (uint16_t{kind} << 8)); break;
      case 4: d = s ^ 0x8000; break;
      case 5:  // odd values
        d = static_cast<uint16_t>(arg & 1 ? 0x7F80 | (arg >> 1) : 0x8000 | (arg >> 1));
        break;
      case 6:  // a run of changes
        for (size_t j = i; j < n && j < i + arg; ++j) (*dst)[j] ^= 1 + (j & 0x3);
        d = (*dst)[i];
        break;
      default: d = static_cast<uint16_t>(s + arg); break;
    }
    (*dst)[i] = d;
    ++i;
  }
}

int FuzzRoundTrip(const uint8_t* data, size_t size) {
  Consumer in(data, size);
  const uint8_t option_byte = in.Byte();
  Options options;
  options.format = (option_byte & 1) ? Format::kPublished : Format::kDefault;
  options.effort = (option_byte >> 1) & 3;
  options.chunk_elements = 1u << (10 + ((option_byte >> 3) & 3));  // 1K..8K: many chunks
  options.threads = 1;
  std::vector<uint16_t> src, dst;
  BuildPair(&in, &src, &dst);
  const size_t n = src.size();

  Delta delta;
  Status s = delta_compress(src.data(), dst.data(), n, &delta, options);
  FUZZ_CHECK(s.ok(), s.ToString().c_str());
  FUZZ_CHECK(delta.checksum == Checksum(dst.data(), n), "wrong checksum");

  std::vector<uint16_t> out(n + 1, 0xBEEF);
  s = delta_decompress(src.data(), n, delta.bytes.data(), delta.bytes.size(), delta.checksum,
                       out.data(), n, 1);
  FUZZ_CHECK(s.ok(), s.ToString().c_str());
  FUZZ_CHECK(n == 0 || std::memcmp(out.data(), dst.data(), n * 2) == 0,
             "decoded a different tensor");
  FUZZ_CHECK(out[n] == 0xBEEF, "write past count");
  std::vector<uint16_t> in_place = src;
  s = delta_decompress(in_place.data(), n, delta.bytes.data(), delta.bytes.size(), delta.checksum,
                       in_place.data(), n, 2);
  FUZZ_CHECK(s.ok() && in_place == dst, "in-place decode differs");

  // Determinism: again, with two threads, and on another compiled target.
  Options again = options;
  again.threads = 2;
  Delta second;
  FUZZ_CHECK(delta_compress(src.data(), dst.data(), n, &second, again).ok(), "second compress");
  FUZZ_CHECK(second.bytes == delta.bytes, "compressing twice gave different bytes");
  // One other compiled target per input (bits 5-7 of the options byte pick it): over a
  // campaign every target is compared, at a third of the cost of all of them each time.
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  const int64_t target = targets[(option_byte >> 5) % targets.size()];
  hwy::SetSupportedTargetsForTest(target);
  Delta on_target;
  const Status t = delta_compress(src.data(), dst.data(), n, &on_target, options);
  std::vector<uint16_t> decoded(n);
  const Status d = delta_decompress(src.data(), n, delta.bytes.data(), delta.bytes.size(),
                                    delta.checksum, decoded.data(), n, 1);
  hwy::SetSupportedTargetsForTest(0);
  FUZZ_CHECK(t.ok(), "compress failed on a target");
  FUZZ_CHECK(on_target.bytes == delta.bytes, hwy::TargetName(target));
  FUZZ_CHECK(d.ok() && decoded == dst, hwy::TargetName(target));
  return 0;
}

}  // namespace fuzz
}  // namespace arc_v3

ARC_V3_FUZZ_ENTRY(arc_v3::fuzz::FuzzRoundTrip)

// Bit-flip campaign: every single-bit corruption of a set of payloads (both formats,
// several densities, multi-chunk, every chunk coding) must either decode to exactly the
// original target or fail with an error that leaves `out` untouched - never crash, never
// report a wrong tensor as success. corruption_test.cc does this on small payloads; here
// every bit of larger, multi-chunk payloads is flipped, in place and out of place.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "arc_v3.hpp"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

struct FlipResult {
  size_t flips = 0, decoded = 0;  // decoded: still decoded (to the exact target)
};

FlipResult FlipEveryBit(const std::vector<uint16_t>& src, const std::vector<uint16_t>& dst,
                        const Options& options) {
  Delta delta;
  REQUIRE(delta_compress(src, dst, &delta, options).ok());
  const size_t n = src.size();
  FlipResult result;
  std::vector<uint8_t> bytes = delta.bytes;
  std::vector<uint16_t> out(n + 1);
  std::vector<uint16_t> in_place;
  for (size_t bit = 0; bit < 8 * bytes.size(); ++bit) {
    bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    out.assign(n + 1, 0xBEEF);
    const Status s = delta_decompress(src.data(), n, bytes.data(), bytes.size(), delta.checksum,
                                      out.data(), n, /*threads=*/1);
    ++result.flips;
    if (s.ok()) {
      ++result.decoded;
      REQUIRE_MESSAGE(std::equal(dst.begin(), dst.end(), out.begin()), "bit ", bit,
                      " decoded to a wrong tensor reported as success");
    } else {
      REQUIRE_MESSAGE(s.code() != ErrorCode::kInternal, "bit ", bit, ": ", s.ToString());
      for (size_t i = 0; i < n; ++i) {
        if (out[i] != 0xBEEF) FAIL_CHECK("bit ", bit, ": out written on error ", s.ToString());
      }
    }
    REQUIRE_MESSAGE(out[n] == 0xBEEF, "bit ", bit, ": write past count");
    if (bit % 7 == 0) {  // in place on a sample: src must survive a failed apply
      in_place = src;
      const Status t = delta_decompress(in_place.data(), n, bytes.data(), bytes.size(),
                                        delta.checksum, in_place.data(), n, 2);
      REQUIRE(t.code() == s.code());
      REQUIRE(in_place == (t.ok() ? dst : src));
    }
    bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  return result;
}

TEST_CASE("every single-bit flip decodes exactly or fails cleanly") {
  struct Case {
    double density;
    test::Mix mix;
    size_t n;
  };
  // 6 chunks of 1024 (the last one short); densities from nearly empty to everything.
  const size_t n = 5 * 1024 + 333;
  size_t total_flips = 0, total_decoded = 0;
  for (const double density : {0.0005, 0.02, 0.3, 1.0}) {
    std::vector<uint16_t> src, dst;
    test::MakeDelta(n, test::Mix{density, 0.03, 0.01}, static_cast<uint32_t>(density * 1e4), &src,
                    &dst);
    // One chunk unchanged, so that every chunk mode appears in the payload.
    for (size_t i = 1024; i < 2048; ++i) dst[i] = src[i];
    for (const Format format : {Format::kPublished, Format::kDefault}) {
      for (const int effort : {0, 3}) {
        Options options;
        options.format = format;
        options.effort = effort;
        options.chunk_elements = 1024;
        INFO("density ", density, " format ", static_cast<int>(format), " effort ", effort);
        const FlipResult r = FlipEveryBit(src, dst, options);
        total_flips += r.flips;
        total_decoded += r.decoded;
      }
    }
  }
  std::printf("bit flips: %zu, of which %zu still decoded to the exact target\n", total_flips,
              total_decoded);
  CHECK(total_flips > 100000);
}

}  // namespace
}  // namespace arc_v3

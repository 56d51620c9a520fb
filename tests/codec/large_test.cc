// A tensor of more than 2^31 elements (4 GiB per array): element counts, chunk indices and
// offsets must use 64-bit arithmetic everywhere. Needs ~8.5 GiB of memory and a minute or
// two, so it is tagged manual: bazel test //tests/codec:large_test (or set
// ARC_V3_LARGE_ELEMENTS to try another count, e.g. 5000000000 for > 2^32).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

TEST_CASE("a tensor of more than 2^31 elements round-trips in both formats") {
  size_t n = (size_t{1} << 31) + (size_t{1} << 20) + 123;
  if (const char* env = std::getenv("ARC_V3_LARGE_ELEMENTS")) n = std::stoull(env);
  std::printf("elements: %zu\n", n);
  auto start = std::chrono::steady_clock::now();
  std::vector<uint16_t> src(n), dst(n);
  const auto fill_src = [&] {
    for (size_t i = 0; i < n; ++i) {
      src[i] = static_cast<uint16_t>(0x3C00 + ((i * 2654435761u) >> 20 & 0x3FF));
    }
  };
  fill_src();
  dst = src;
  // Changes every 4099 elements, and at the places 32-bit arithmetic would break: around
  // 2^31 and 2^32 (if inside), and the last element.
  for (size_t i = 17; i < n; i += 4099) dst[i] ^= 1 + (i & 0x7F);
  for (const size_t edge : {size_t{1} << 31, size_t{1} << 32}) {
    for (size_t i = edge - 2; i < edge + 2 && i < n; ++i) dst[i] ^= 0x8001;
  }
  dst[n - 1] ^= 0x0042;
  std::printf("fill: %.1f s\n", Seconds(start));

  for (const Format format : {Format::kPublished, Format::kDefault}) {
    INFO("format ", static_cast<int>(format));
    Options options;
    options.format = format;
    options.effort = 1;
    start = std::chrono::steady_clock::now();
    Delta delta;
    const Status s = delta_compress(src.data(), dst.data(), n, &delta, options);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    std::printf("format %d: compress %.1f s, %zu bytes\n", static_cast<int>(format), Seconds(start),
                delta.bytes.size());
    CHECK(delta.checksum == Checksum(dst.data(), n));
    PayloadInfo info;
    REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
    CHECK(info.element_count == n);
    CHECK(info.chunk_count == (n + info.chunk_elements - 1) / info.chunk_elements);
    PayloadStats stats;
    REQUIRE(delta_stats(src.data(), n, delta.bytes.data(), delta.bytes.size(), &stats).ok());
    size_t changed = 0;
    for (size_t i = 0; i < n; ++i) changed += src[i] != dst[i];
    CHECK(stats.changed == changed);

    // Apply in place (out == src), then restore src for the next format: 8 GiB in all.
    start = std::chrono::steady_clock::now();
    std::vector<uint16_t>& work = src;
    const Status d = delta_decompress(work.data(), n, delta.bytes.data(), delta.bytes.size(),
                                      delta.checksum, work.data());
    REQUIRE_MESSAGE(d.ok(), d.ToString());
    std::printf("format %d: decompress in place %.1f s\n", static_cast<int>(format),
                Seconds(start));
    CHECK(work == dst);
    fill_src();
  }
}

}  // namespace
}  // namespace arc_v3

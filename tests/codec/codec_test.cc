// Round trips through the public API: lengths, class mixes, odd values, options,
// determinism across threads and SIMD targets, in-place apply, and the peek calls.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/codec_internal.h"
#include "src/codec/format.h"
#include "src/codec/kernels.h"
#include "tests/hwy_doctest.h"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

using test::MakeDelta;
using test::Mix;

// Compresses, checks the checksum, decompresses out of place and in place, compares.
Delta RoundTrip(const std::vector<uint16_t>& src, const std::vector<uint16_t>& dst,
                const Options& options = Options()) {
  REQUIRE(src.size() == dst.size());
  Delta delta;
  const Status status = delta_compress(src.data(), dst.data(), src.size(), &delta, options);
  REQUIRE_MESSAGE(status.ok(), status.ToString());
  CHECK(delta.checksum == Checksum(dst.data(), dst.size()));

  std::vector<uint16_t> out(src.size() + 2, 0xBEEF);
  const Status decoded = delta_decompress(src.data(), src.size(), delta.bytes.data(),
                                          delta.bytes.size(), delta.checksum, out.data());
  REQUIRE_MESSAGE(decoded.ok(), decoded.ToString());
  REQUIRE(std::equal(dst.begin(), dst.end(), out.begin()));  // memcmp rejects null for n = 0
  CHECK(out[src.size()] == 0xBEEF);                          // nothing written past count
  CHECK(out[src.size() + 1] == 0xBEEF);

  std::vector<uint16_t> in_place = src;
  const Status applied = delta_decompress(in_place.data(), in_place.size(), delta.bytes.data(),
                                          delta.bytes.size(), delta.checksum, in_place.data());
  REQUIRE_MESSAGE(applied.ok(), applied.ToString());
  REQUIRE(in_place == dst);

  PayloadStats stats;
  REQUIRE(delta_stats(src.data(), src.size(), delta.bytes.data(), delta.bytes.size(), &stats).ok());
  const ChangeCounts truth = ref::ClassifyChanges(src.data(), dst.data(), src.size());
  CHECK(stats.info.element_count == src.size());
  CHECK(stats.counts_known);
  CHECK(stats.changed == truth.changed);
  CHECK(stats.exponent_or_sign == truth.high);
  CHECK(stats.position_bytes + stats.mantissa_bytes + stats.high_bytes + stats.modelled_bytes +
            stats.rans_bytes + stats.overhead_bytes ==
        delta.bytes.size());
  CHECK(stats.chunk_modes[0] + stats.chunk_modes[1] + stats.chunk_modes[2] + stats.chunk_modes[3] ==
        stats.info.chunk_count);

  // Without the base, modelled chunks can be measured but not counted.
  PayloadStats blind;
  REQUIRE(delta_stats(delta.bytes.data(), delta.bytes.size(), &blind).ok());
  CHECK(blind.modelled_bytes == stats.modelled_bytes);
  CHECK(blind.rans_bytes == stats.rans_bytes);
  CHECK(blind.counts_known == (stats.chunk_modes[2] + stats.chunk_modes[3] == 0));
  if (blind.counts_known) CHECK(blind.changed == stats.changed);
  return delta;
}

Options SmallChunks() {
  Options options;
  options.chunk_elements = 1024;
  return options;
}

TEST_CASE("round trip: lengths 0, 1, odd, chunk edges") {
  for (const size_t n : {0, 1, 2, 3, 7, 31, 1023, 1024, 1025, 4097, 10001}) {
    std::vector<uint16_t> src, dst;
    MakeDelta(n, Mix{0.05}, static_cast<uint32_t>(n), &src, &dst);
    RoundTrip(src, dst);
    RoundTrip(src, dst, SmallChunks());
  }
}

TEST_CASE("a last chunk of an eighth or less joins the first: one chunk of twice the size") {
  // 1024 + 128 elements in chunks of 1024: one chunk of 2048; 1024 + 129: two chunks, as
  // with 3 * 1024 + 1 (more than two chunks never merge).
  for (const auto& [n, chunks, chunk_elements] :
       std::vector<std::tuple<size_t, uint64_t, uint32_t>>{{1024 + 128, 1, 2048},
                                                           {1024 + 129, 2, 1024},
                                                           {3 * 1024 + 1, 4, 1024},
                                                           {1024, 1, 1024}}) {
    CAPTURE(n);
    std::vector<uint16_t> src, dst;
    MakeDelta(n, Mix{0.05}, static_cast<uint32_t>(n), &src, &dst);
    const Delta delta = RoundTrip(src, dst, SmallChunks());
    PayloadInfo info;
    REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
    CHECK(info.chunk_count == chunks);
    CHECK(info.chunk_elements == chunk_elements);
  }
}

TEST_CASE("column signs") {
  // A 2000 x 120 matrix whose updates share their column's sign: its modelled chunk codes
  // signs with column counters (period 120).
  std::mt19937 rng(31);
  const std::vector<uint16_t> src = test::GaussianWeights(2000 * 120, &rng);
  const std::vector<uint16_t> dst = test::ColumnCoherentStep(src, 120, 0.005, 0.9, &rng);
  Delta delta;
  REQUIRE(delta_compress(src, dst, &delta).ok());
  CHECK(delta.bytes[4] == kFormatVersion);
  const size_t chunk_at = 4 + 1 + 1 + 3 + 1;  // magic version flags count(3) log
  REQUIRE(delta.bytes[chunk_at] == kChunkModelled);
  CHECK((delta.bytes[chunk_at + 1] & kModelColumnSigns) != 0);
  std::vector<uint16_t> out;
  REQUIRE(delta_decompress(src, delta, &out).ok());
  CHECK(out == dst);
  // Without column structure the chunk codes its signs without column counters.
  Delta plain;
  REQUIRE(delta_compress(src, test::ColumnCoherentStep(src, 120, 0.005, 0.5, &rng), &plain).ok());
  REQUIRE(plain.bytes[chunk_at] == kChunkModelled);
  CHECK((plain.bytes[chunk_at + 1] & kModelColumnSigns) == 0);
}

TEST_CASE("round trip: nothing changed, everything changed") {
  std::vector<uint16_t> src, dst;
  MakeDelta(5000, Mix{0.0}, 1, &src, &dst);
  const Delta none = RoundTrip(src, dst, SmallChunks());
  CHECK(none.bytes.size() < 32);  // header and one byte per empty chunk

  for (auto& v : dst) v ^= 0x0001;
  RoundTrip(src, dst, SmallChunks());
  for (auto& v : dst) v ^= 0xFFFF;  // every field of every element
  RoundTrip(src, dst, SmallChunks());
}

TEST_CASE("round trip: sign flips, exponent carries, all class mixes") {
  for (const double density : {0.001, 0.02, 0.1, 0.5, 1.0}) {
    for (const Mix mix : {Mix{density, 0.0, 0.0}, Mix{density, 0.02, 0.001}, Mix{density, 0.5, 0.0},
                          Mix{density, 0.0, 1.0}, Mix{density, 0.5, 0.5}}) {
      std::vector<uint16_t> src, dst;
      MakeDelta(20000, mix, static_cast<uint32_t>(density * 1000), &src, &dst);
      RoundTrip(src, dst, SmallChunks());
    }
  }
}

TEST_CASE("round trip: every transition between special values") {
  const std::vector<uint16_t> special = test::SpecialValues();
  std::vector<uint16_t> src, dst;
  for (const uint16_t a : special) {
    for (const uint16_t b : special) {
      src.push_back(a);
      dst.push_back(b);
    }
  }
  RoundTrip(src, dst);
  RoundTrip(dst, src);
}

TEST_CASE("round trip: every effort, format and thread count gives the same result") {
  std::vector<uint16_t> src, dst;
  MakeDelta(300000, Mix{0.02}, 3, &src, &dst);
  for (const int effort : {0, 1, 2, 3}) {
    Options options;
    options.effort = effort;
    options.chunk_elements = 1 << 16;
    options.threads = 1;
    const Delta one = RoundTrip(src, dst, options);
    options.threads = 3;
    const Delta three = RoundTrip(src, dst, options);
    CHECK(one.bytes == three.bytes);
    options.format = Format::kPublished;
    const Delta published = RoundTrip(src, dst, options);
    PayloadInfo info;
    REQUIRE(delta_inspect(published.bytes.data(), published.bytes.size(), &info).ok());
    CHECK(info.format_version == kFormatVersionArcV3);
    REQUIRE(delta_inspect(one.bytes.data(), one.bytes.size(), &info).ok());
    CHECK(info.format_version == kFormatVersion);
  }
}

TEST_CASE("checksums computed while encoding equal Checksum of src and dst") {
  std::vector<uint16_t> src, dst;
  MakeDelta(300001, Mix{0.02}, 4, &src, &dst);
  // The streaming checksum over uneven pieces.
  ChecksumStream stream;
  size_t at = 0;
  for (const size_t piece : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{100000}}) {
    stream.Update(src.data() + at, piece);
    at += piece;
  }
  stream.Update(src.data() + at, src.size() - at);
  CHECK(stream.Digest() == Checksum(src.data(), src.size()));
  for (const int threads : {1, 2}) {  // fused chunk by chunk on one thread, apart on two
    Options options;
    options.chunk_elements = 1 << 16;
    options.threads = threads;
    Delta delta;
    uint64_t base_checksum = 0;
    REQUIRE(EncodeFrame(src.data(), dst.data(), src.size(), options, nullptr, nullptr, &delta,
                        &base_checksum)
                .ok());
    CHECK(base_checksum == Checksum(src.data(), src.size()));
    CHECK(delta.checksum == Checksum(dst.data(), dst.size()));
    CHECK(base_checksum != delta.checksum);
  }
}

TEST_CASE("the default format is smaller than ARCv3 as published on weight-like deltas") {
  for (const double density : {0.002, 0.02, 0.1}) {
    std::vector<uint16_t> src, dst;
    MakeDelta(1 << 18, Mix{density}, 77, &src, &dst);
    Options published;
    published.format = Format::kPublished;
    const Delta arcv3 = RoundTrip(src, dst, published);
    const Delta modelled = RoundTrip(src, dst);
    INFO("density ", density, ": ARCv3 ", arcv3.bytes.size(), " bytes, default ",
         modelled.bytes.size(), " bytes");
    CHECK(modelled.bytes.size() < arcv3.bytes.size());
  }
}

TEST_CASE("the payload does not depend on the SIMD target") {
  std::vector<uint16_t> src, dst;
  MakeDelta(100000, Mix{0.03, 0.1, 0.01}, 9, &src, &dst);
  std::vector<uint8_t> first;
  test::ForEachTarget([&](const char* target) {
    Delta delta = RoundTrip(src, dst, SmallChunks());
    if (first.empty()) first = delta.bytes;
    INFO("target ", target);
    CHECK(delta.bytes == first);
  });
}

TEST_CASE("higher effort is never larger on realistic data") {
  std::vector<uint16_t> src, dst;
  MakeDelta(1 << 20, Mix{0.004}, 17, &src, &dst);
  size_t previous = SIZE_MAX;
  for (const int effort : {0, 1, 2, 3}) {
    Options options;
    options.effort = effort;
    options.format = Format::kPublished;
    Delta delta;
    REQUIRE(delta_compress(src.data(), dst.data(), src.size(), &delta, options).ok());
    INFO("effort ", effort, ": ", delta.bytes.size(), " bytes");
    CHECK(delta.bytes.size() <= previous);
    previous = delta.bytes.size();
  }
  // Far below the 2 bytes per element of the raw tensor.
  CHECK(previous < src.size() * 2 / 50);
}

TEST_CASE("vector overloads and delta_inspect") {
  std::vector<uint16_t> src, dst, out;
  MakeDelta(3000, Mix{0.1}, 4, &src, &dst);
  Delta delta;
  REQUIRE(delta_compress(src, dst, &delta, SmallChunks()).ok());
  REQUIRE(delta_decompress(src, delta, &out).ok());
  CHECK(out == dst);

  PayloadInfo info;
  REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
  CHECK(info.element_count == 3000);
  CHECK(info.chunk_elements == 1024);
  CHECK(info.chunk_count == 3);
  CHECK(info.format_version == kFormatVersion);
  CHECK(info.tensor_count == 1);

  std::vector<uint16_t> shorter(src.begin(), src.end() - 1);
  CHECK(delta_compress(shorter, dst, &delta).code() == ErrorCode::kSizeMismatch);
}

TEST_CASE("bad options and arguments are rejected") {
  std::vector<uint16_t> v(10, 1);
  Delta delta;
  Options options;
  options.effort = 4;
  CHECK(delta_compress(v.data(), v.data(), v.size(), &delta, options).code() ==
        ErrorCode::kInvalidArgument);
  options = Options();
  options.chunk_elements = 1000;  // not a power of two
  CHECK(delta_compress(v.data(), v.data(), v.size(), &delta, options).code() ==
        ErrorCode::kInvalidArgument);
  options.chunk_elements = 1u << 25;
  CHECK(delta_compress(v.data(), v.data(), v.size(), &delta, options).code() ==
        ErrorCode::kInvalidArgument);
  options = Options();
  options.threads = -1;
  CHECK(delta_compress(v.data(), v.data(), v.size(), &delta, options).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(delta_compress(nullptr, v.data(), v.size(), &delta).code() == ErrorCode::kInvalidArgument);
  CHECK(delta_compress(v.data(), v.data(), v.size(), nullptr).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(delta_compress(nullptr, nullptr, 0, &delta).ok());
}

TEST_CASE("version and error names") {
  CHECK(std::string(VersionString()) == "2.0.0");
  // The number encodes the string as major * 10000 + minor * 100 + patch (20000 for 2.0.0).
  unsigned v_major = 0, v_minor = 0, v_patch = 0;
  REQUIRE(std::sscanf(VersionString(), "%u.%u.%u", &v_major, &v_minor, &v_patch) == 3);
  CHECK(VersionNumber() == v_major * 10000 + v_minor * 100 + v_patch);
  CHECK(std::string(ErrorName(ErrorCode::kChecksumMismatch)) == "checksum_mismatch");
  for (int code = 0; code < static_cast<int>(ErrorCode::kMaxCode); ++code) {
    CHECK(std::string(ErrorName(static_cast<ErrorCode>(code))) != "unknown_error");
  }
  CHECK(Status(ErrorCode::kTruncated, "cut").ToString() == "truncated: cut");
  MESSAGE("kernels dispatch to ", std::string(ActiveTarget()));
  CHECK(std::string(ActiveTarget()).size() > 0);
}

}  // namespace
}  // namespace arc_v3

TEST_CASE("delta_compress can report src's checksum, with the same payload") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{5000}, size_t{3} << 20}) {
    std::vector<uint16_t> src, dst;
    arc_v3::test::MakeDelta(n, arc_v3::test::Mix{0.02}, static_cast<uint32_t>(n + 7), &src, &dst);
    arc_v3::Options options;
    options.threads = 1;
    arc_v3::Delta plain, with;
    uint64_t src_checksum = 1;
    REQUIRE(arc_v3::delta_compress(src.data(), dst.data(), n, &plain, options).ok());
    REQUIRE(arc_v3::delta_compress(src.data(), dst.data(), n, &with, options, &src_checksum).ok());
    CHECK(with.bytes == plain.bytes);
    CHECK(with.checksum == plain.checksum);
    CHECK(src_checksum == arc_v3::Checksum(src.data(), n));
  }
  std::vector<uint16_t> v(10, 1);
  arc_v3::Delta d;
  CHECK(
      arc_v3::delta_compress(v.data(), v.data(), v.size(), &d, arc_v3::Options(), nullptr).code() ==
      arc_v3::ErrorCode::kInvalidArgument);
}

// 1.x keeps the names a 1.0 header had, deprecated, meaning what they meant.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
TEST_CASE("deprecated 1.0 names still compile and mean the same") {
  CHECK(arc_v3::Format::kArcV3 == arc_v3::Format::kPublished);
  CHECK(static_cast<int>(arc_v3::Format::kPublished) == 1);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

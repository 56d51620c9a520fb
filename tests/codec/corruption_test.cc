// Bad input: truncation at every offset, bit flips in header and body, the wrong base,
// size mismatches, a too-small output. Each must give an error (or, for a flip that
// leaves an equivalent payload, the exact right result) - never a crash, never a write
// past `out`, and on error `out` is untouched.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/format.h"
#include "src/codec/model_coder.h"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

constexpr uint16_t kUntouched = 0xD00D;
constexpr size_t kGuard = 16;

struct Fixture {
  std::vector<uint16_t> src, dst;
  Delta delta;
  Fixture(size_t n, double density, uint32_t chunk_elements = 1024, int effort = 2,
          Format format = Format::kDefault) {
    test::MakeDelta(n, test::Mix{density, 0.05, 0.01}, 21, &src, &dst);
    Options options;
    options.chunk_elements = chunk_elements;
    options.effort = effort;
    options.format = format;
    REQUIRE(delta_compress(src.data(), dst.data(), n, &delta, options).ok());
  }
};

// Decodes `payload` into a guarded buffer. Returns the status; checks the guards, and
// that the buffer is untouched on error and exactly dst on success.
Status DecodeGuarded(const Fixture& f, const std::vector<uint8_t>& payload, uint64_t checksum) {
  const size_t n = f.src.size();
  std::vector<uint16_t> out(n + 2 * kGuard, kUntouched);
  const Status status = delta_decompress(f.src.data(), n, payload.data(), payload.size(), checksum,
                                         out.data() + kGuard, n, 1);
  for (size_t i = 0; i < kGuard; ++i) {
    REQUIRE(out[i] == kUntouched);
    REQUIRE(out[kGuard + n + i] == kUntouched);
  }
  if (status.ok()) {
    REQUIRE(std::memcmp(out.data() + kGuard, f.dst.data(), n * 2) == 0);
  } else {
    for (size_t i = 0; i < n; ++i) REQUIRE(out[kGuard + i] == kUntouched);
    REQUIRE(status.code() != ErrorCode::kOk);
    REQUIRE(!status.message().empty());
  }
  return status;
}

// Every chunk coding: XOR streams in format versions 1 and 2, and modelled chunks.
struct Coding {
  int effort;
  Format format;
};
constexpr Coding kCodings[] = {
    {0, Format::kPublished}, {2, Format::kPublished}, {0, Format::kDefault}, {2, Format::kDefault}};

TEST_CASE("truncation at every offset is an error") {
  for (const Coding coding : kCodings) {
    Fixture f(3000, 0.05, 1024, coding.effort, coding.format);
    for (size_t size = 0; size < f.delta.bytes.size(); ++size) {
      std::vector<uint8_t> cut(f.delta.bytes.begin(), f.delta.bytes.begin() + size);
      INFO("truncated to ", size, " of ", f.delta.bytes.size());
      const Status status = DecodeGuarded(f, cut, f.delta.checksum);
      REQUIRE(!status.ok());
    }
    // Version 1 stores every chunk's size, so a byte too many is past the frame; from
    // version 3 the last chunk runs to the end and the byte is too many for the chunk.
    std::vector<uint8_t> longer = f.delta.bytes;
    longer.push_back(0);
    CHECK(DecodeGuarded(f, longer, f.delta.checksum).code() == (coding.format == Format::kPublished
                                                                    ? ErrorCode::kCorruptHeader
                                                                    : ErrorCode::kCorruptChunk));
  }
}

TEST_CASE("every single-bit flip is an error or decodes exactly") {
  for (const Coding coding : kCodings) {
    for (const double density : {0.01, 0.3}) {
      Fixture f(2500, density, 1024, coding.effort, coding.format);
      size_t errors = 0, flips = 0;
      for (size_t byte = 0; byte < f.delta.bytes.size(); ++byte) {
        for (int bit = 0; bit < 8; ++bit) {
          std::vector<uint8_t> flipped = f.delta.bytes;
          flipped[byte] ^= static_cast<uint8_t>(1u << bit);
          INFO("byte ", byte, " bit ", bit);
          errors += !DecodeGuarded(f, flipped, f.delta.checksum).ok();
          ++flips;
        }
      }
      MESSAGE("format ", static_cast<int>(coding.format), " effort ", coding.effort, " density ",
              density, ": ", errors, " of ", flips, " flips rejected");
      // Every field is validated and the checksum covers the rest, so a flip can only pass
      // when it leaves the decoded result unchanged: unused bits of a zstd stream, or the
      // last bits of a range-coded stream, below the precision its final symbols needed.
      CHECK(errors * 100 >= flips * 90);
    }
  }
}

TEST_CASE("header fields are validated") {
  Fixture f(2000, 0.05);
  const std::vector<uint8_t>& good = f.delta.bytes;
  REQUIRE(good[4] == kFormatVersion);
  auto with = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> bad = good;
    bad[at] = value;
    return DecodeGuarded(f, bad, f.delta.checksum).code();
  };
  CHECK(with(0, 'X') == ErrorCode::kBadMagic);
  // Only 1 (ARCv3 as published) and 16: the values between belonged to unreleased formats.
  for (int version = 0; version < 256; ++version) {
    if (version == kFormatVersion) continue;
    const ErrorCode code = with(4, static_cast<uint8_t>(version));
    if (version == kFormatVersionArcV3) {
      CHECK(code != ErrorCode::kOk);  // the chunks read as XOR streams: they do not hold
    } else {
      CHECK(code == ErrorCode::kUnsupportedVersion);
    }
  }
  CHECK(with(5, 0x08) == ErrorCode::kReservedBitsSet);
  CHECK(with(5, 0x80) == ErrorCode::kReservedBitsSet);
  CHECK(with(5, 0x04) == ErrorCode::kCorruptHeader);  // Continues without Session
  CHECK(with(5, 0x02) != ErrorCode::kOk);  // several tensors: the chunk table read as their list
  CHECK(DecodeGuarded(f, {}, f.delta.checksum).code() == ErrorCode::kTruncated);
  const std::vector<uint8_t> garbage(100, 0x5A);
  CHECK(DecodeGuarded(f, garbage, f.delta.checksum).code() == ErrorCode::kBadMagic);

  PayloadInfo info;
  CHECK(delta_inspect(good.data(), 3, &info).code() == ErrorCode::kTruncated);
  CHECK(delta_inspect(garbage.data(), garbage.size(), &info).code() == ErrorCode::kBadMagic);
}

TEST_CASE("the wrong base is reported through the checksum") {
  Fixture f(5000, 0.02);
  Fixture other = f;
  other.src[1234] ^= 0x0001;  // one bit of one weight differs
  CHECK(DecodeGuarded(other, f.delta.bytes, f.delta.checksum).code() ==
        ErrorCode::kChecksumMismatch);
  CHECK(DecodeGuarded(f, f.delta.bytes, f.delta.checksum ^ 1).code() ==
        ErrorCode::kChecksumMismatch);

  // In place: the base must be left exactly as it was.
  std::vector<uint16_t> base = other.src;
  const Status status = delta_decompress(base.data(), base.size(), f.delta.bytes.data(),
                                         f.delta.bytes.size(), f.delta.checksum, base.data());
  CHECK(status.code() == ErrorCode::kChecksumMismatch);
  CHECK(base == other.src);
}

TEST_CASE("size mismatches and a too-small output") {
  Fixture f(4000, 0.02);
  const std::vector<uint8_t>& bytes = f.delta.bytes;
  std::vector<uint16_t> out(4000, kUntouched);
  CHECK(delta_decompress(f.src.data(), 3999, bytes.data(), bytes.size(), f.delta.checksum,
                         out.data(), 4000)
            .code() == ErrorCode::kSizeMismatch);
  CHECK(delta_decompress(f.src.data(), 4000, bytes.data(), bytes.size(), f.delta.checksum,
                         out.data(), 3999)
            .code() == ErrorCode::kOutputTooSmall);
  CHECK(delta_decompress(f.src.data(), 0, bytes.data(), bytes.size(), f.delta.checksum, out.data())
            .code() == ErrorCode::kSizeMismatch);
  for (const uint16_t v : out) REQUIRE(v == kUntouched);
  CHECK(delta_decompress(nullptr, 4000, bytes.data(), bytes.size(), f.delta.checksum, out.data())
            .code() == ErrorCode::kInvalidArgument);
  // Partially overlapping src and out.
  std::vector<uint16_t> buffer(8001);
  std::memcpy(buffer.data(), f.src.data(), 8000);
  CHECK(delta_decompress(buffer.data(), 4000, bytes.data(), bytes.size(), f.delta.checksum,
                         buffer.data() + 1)
            .code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("stream-level corruption: codec ids, sizes, reserved layout bits") {
  // One chunk of format version 1, low density: the layout is magic(4) version flags
  // count(2) log | table | changed high layout | streams.
  Fixture f(1000, 0.05, 1024, 0, Format::kPublished);
  const std::vector<uint8_t>& good = f.delta.bytes;
  size_t chunk_start = 4 + 1 + 1 + 2 + 1;
  const size_t table = good[chunk_start] < 0x80 ? 1 : 2;
  chunk_start += table;
  size_t layout_at = chunk_start;
  while (good[layout_at] & 0x80) ++layout_at;  // changed count
  ++layout_at;
  while (good[layout_at] & 0x80) ++layout_at;  // high count
  ++layout_at;
  REQUIRE(good[layout_at] <= 1);
  for (const uint8_t layout : {uint8_t{0x04}, uint8_t{0x80}, uint8_t{0x02}, uint8_t{0x03}}) {
    std::vector<uint8_t> bad = good;
    bad[layout_at] = layout;
    CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() == ErrorCode::kReservedBitsSet);
  }
  std::vector<uint8_t> bad = good;
  bad[layout_at + 1] = 7;  // positions stream codec id
  CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() == ErrorCode::kReservedBitsSet);
}

TEST_CASE("chunk modes are validated") {
  // One chunk: magic(4) version flags count(2) log | (no table: the only chunk is the
  // last) | mode ...
  Fixture f(1000, 0.05, 1024, 2, Format::kDefault);
  REQUIRE(f.delta.bytes[4] == kFormatVersion);
  const size_t mode_at = 4 + 1 + 1 + 2 + 1;
  REQUIRE(f.delta.bytes[mode_at] == 2);  // modelled
  for (const uint8_t mode : {uint8_t{5}, uint8_t{0x80}, uint8_t{0xFF}}) {
    std::vector<uint8_t> bad = f.delta.bytes;
    bad[mode_at] = mode;
    CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() == ErrorCode::kReservedBitsSet);
  }
  std::vector<uint8_t> bad = f.delta.bytes;
  bad[mode_at] = 4;  // rANS with a session history, outside a session
  CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() == ErrorCode::kCorruptChunk);
  bad = f.delta.bytes;
  bad[mode_at] = 0;  // "unchanged" followed by bytes
  CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() == ErrorCode::kCorruptChunk);
  // A modelled chunk read as rANS: its bytes do not hold together.
  bad[mode_at] = 3;
  CHECK(DecodeGuarded(f, bad, f.delta.checksum).code() != ErrorCode::kOk);
}

}  // namespace
}  // namespace arc_v3

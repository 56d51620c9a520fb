// delta_compress_tensors / delta_decompress_tensors: several tensors in one payload
// (format version 6, src/codec/FORMAT.md "Frame_Header").
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/codec_internal.h"
#include "src/codec/format.h"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

// A group of tensors as a model has them: a few sizes, including an empty one and one
// that spans several chunks of 1024 elements.
struct Group {
  std::vector<std::vector<uint16_t>> src, dst;

  explicit Group(const std::vector<size_t>& sizes, double density = 0.01, uint32_t seed = 7) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      std::vector<uint16_t> s, d;
      test::MakeDelta(sizes[t], test::Mix{density}, seed + static_cast<uint32_t>(t), &s, &d);
      src.push_back(s);
      dst.push_back(d);
    }
  }
  std::vector<TensorDelta> Deltas() const {
    std::vector<TensorDelta> deltas(src.size());
    for (size_t t = 0; t < src.size(); ++t) {
      deltas[t] = {src[t].data(), dst[t].data(), src[t].size()};
    }
    return deltas;
  }
  std::vector<uint16_t> Concatenated(const std::vector<std::vector<uint16_t>>& parts) const {
    std::vector<uint16_t> all;
    for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
    return all;
  }
};

Options SmallChunks(int threads = 1) {
  Options options;
  options.chunk_elements = 1024;
  options.threads = threads;
  return options;
}

const std::vector<size_t> kSizes = {300, 0, 2500, 1, 700, 4096};

TEST_CASE("several tensors round-trip through one payload") {
  const Group group(kSizes);
  Delta delta;
  const std::vector<TensorDelta> deltas = group.Deltas();
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &delta, SmallChunks()).ok());

  PayloadInfo info;
  REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
  CHECK(info.format_version == kFormatVersion);  // modelled chunks
  CHECK(info.tensor_count == kSizes.size());
  const std::vector<uint16_t> all_dst = group.Concatenated(group.dst);
  CHECK(info.element_count == all_dst.size());
  CHECK(delta.checksum == Checksum(all_dst.data(), all_dst.size()));

  // Into separate outputs, and in place.
  std::vector<std::vector<uint16_t>> outs(kSizes.size()), in_place = group.src;
  std::vector<TensorOut> aside(kSizes.size()), same(kSizes.size());
  for (size_t t = 0; t < kSizes.size(); ++t) {
    outs[t].assign(kSizes[t], 0xABCD);
    aside[t] = {group.src[t].data(), outs[t].data(), kSizes[t]};
    same[t] = {in_place[t].data(), in_place[t].data(), kSizes[t]};
  }
  for (const int threads : {1, 2, 0}) {
    REQUIRE(delta_decompress_tensors(aside.data(), aside.size(), delta.bytes.data(),
                                     delta.bytes.size(), delta.checksum, threads)
                .ok());
    CHECK(outs == group.dst);
  }
  REQUIRE(delta_decompress_tensors(same.data(), same.size(), delta.bytes.data(), delta.bytes.size(),
                                   delta.checksum)
              .ok());
  CHECK(in_place == group.dst);
}

TEST_CASE("the bytes are those of the concatenation, whatever the thread count") {
  const Group group(kSizes);
  const std::vector<TensorDelta> deltas = group.Deltas();
  Delta one_thread, two_threads, concatenated;
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &one_thread, SmallChunks(1)).ok());
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &two_threads, SmallChunks(2)).ok());
  CHECK(one_thread.bytes == two_threads.bytes);
  const std::vector<uint16_t> src = group.Concatenated(group.src);
  const std::vector<uint16_t> dst = group.Concatenated(group.dst);
  REQUIRE(delta_compress(src, dst, &concatenated, SmallChunks()).ok());
  CHECK(one_thread.checksum == concatenated.checksum);
  // Same chunks after a header that also names the tensors: the Tensors flag, then (after
  // Element_Count and Chunk_Log) their count and the list check.
  PayloadInfo info;
  REQUIRE(delta_inspect(concatenated.bytes.data(), concatenated.bytes.size(), &info).ok());
  CHECK(info.format_version == kFormatVersion);
  CHECK(one_thread.bytes[4] == kFormatVersion);
  CHECK(one_thread.bytes[5] == kFlagTensors);
  CHECK(concatenated.bytes[5] == 0);
  const size_t list_at = 4 + 1 + 1 + 2 + 1;  // magic, version, flags, count (2), log
  REQUIRE(concatenated.bytes.size() > list_at);
  const size_t list_bytes = 1 + 4;  // 6, then the check of 300, 0, 2500, 1, 700, 4096
  REQUIRE(one_thread.bytes.size() == concatenated.bytes.size() + list_bytes);
  CHECK(one_thread.bytes[list_at] == kSizes.size());
  CHECK(LoadU32(one_thread.bytes.data() + list_at + 1) ==
        TensorListCheck(std::vector<uint64_t>(kSizes.begin(), kSizes.end())));
  CHECK(std::memcmp(one_thread.bytes.data() + list_at + list_bytes,
                    concatenated.bytes.data() + list_at, concatenated.bytes.size() - list_at) == 0);
}

TEST_CASE("many small tensors cost less in one payload than one by one") {
  // 40 tensors of 2,000 elements with ~20 changes each, as norms and biases have.
  const Group group(std::vector<size_t>(40, 2000), 0.01);
  const std::vector<TensorDelta> deltas = group.Deltas();
  Delta together;
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &together).ok());
  size_t apart = 0;
  for (size_t t = 0; t < group.src.size(); ++t) {
    Delta one;
    REQUIRE(delta_compress(group.src[t], group.dst[t], &one).ok());
    apart += one.bytes.size() + sizeof(one.checksum);
  }
  const size_t joint = together.bytes.size() + sizeof(together.checksum);
  MESSAGE("40 tensors: " << joint << " bytes together, " << apart << " one by one");
  CHECK(joint * 10 < apart * 9);  // the frames and checksums alone are ~15% of `apart`
}

TEST_CASE("a one-tensor payload decodes as a list of one, and a group only as a group") {
  const Group group({3000});
  Delta single;
  REQUIRE(delta_compress(group.src[0], group.dst[0], &single).ok());
  std::vector<uint16_t> out(3000);
  TensorOut slot{group.src[0].data(), out.data(), 3000};
  REQUIRE(
      delta_decompress_tensors(&slot, 1, single.bytes.data(), single.bytes.size(), single.checksum)
          .ok());
  CHECK(out == group.dst[0]);
  // A list of one through delta_compress_tensors keeps the Tensors flag.
  const std::vector<TensorDelta> one = group.Deltas();
  Delta listed;
  REQUIRE(delta_compress_tensors(one.data(), 1, &listed).ok());
  PayloadInfo info;
  REQUIRE(delta_inspect(listed.bytes.data(), listed.bytes.size(), &info).ok());
  CHECK(info.format_version == kFormatVersion);
  CHECK(info.tensor_count == 1);
  const Status refused = delta_decompress(group.src[0].data(), 3000, listed.bytes.data(),
                                          listed.bytes.size(), listed.checksum, out.data());
  CHECK(refused.code() == ErrorCode::kSizeMismatch);
  CHECK(refused.message().find("delta_decompress_tensors") != std::string::npos);
  std::fill(out.begin(), out.end(), 0);
  REQUIRE(
      delta_decompress_tensors(&slot, 1, listed.bytes.data(), listed.bytes.size(), listed.checksum)
          .ok());
  CHECK(out == group.dst[0]);
}

TEST_CASE("a tensor list that differs from the payload's is refused, nothing written") {
  const Group group(kSizes);
  const std::vector<TensorDelta> deltas = group.Deltas();
  Delta delta;
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &delta, SmallChunks()).ok());
  std::vector<std::vector<uint16_t>> outs(kSizes.size());
  std::vector<TensorOut> slots(kSizes.size());
  for (size_t t = 0; t < kSizes.size(); ++t) {
    outs[t].assign(kSizes[t] + 1, 0x1234);  // room for one more, to try a wrong count
    slots[t] = {group.src[t].data(), outs[t].data(), kSizes[t]};
  }
  const auto decode = [&](const std::vector<TensorOut>& list) {
    return delta_decompress_tensors(list.data(), list.size(), delta.bytes.data(),
                                    delta.bytes.size(), delta.checksum);
  };
  std::vector<TensorOut> fewer(slots.begin(), slots.end() - 1);
  CHECK(decode(fewer).code() == ErrorCode::kSizeMismatch);
  std::vector<TensorOut> swapped = slots;
  std::swap(swapped[0], swapped[2]);
  const Status wrong_order = decode(swapped);
  CHECK(wrong_order.code() == ErrorCode::kSizeMismatch);
  CHECK(wrong_order.message().find("split otherwise") != std::string::npos);
  std::vector<TensorOut> longer = slots;
  longer[4].count += 1;
  CHECK(decode(longer).code() == ErrorCode::kSizeMismatch);
  // Same total, one element moved from one tensor to the next.
  std::vector<TensorOut> moved = slots;
  moved[4].count += 1;
  moved[5].count -= 1;
  CHECK(decode(moved).code() == ErrorCode::kSizeMismatch);
  // Right shapes, wrong base (a mantissa bit: the coder's contexts see only exponents, so
  // the stream still decodes): the checksum catches it.
  std::vector<uint16_t> other_base = group.src[2];
  other_base[10] ^= 0x0001;
  std::vector<TensorOut> wrong_base = slots;
  wrong_base[2].src = other_base.data();
  CHECK(decode(wrong_base).code() == ErrorCode::kChecksumMismatch);
  for (const auto& out : outs) {
    CHECK(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0x1234; }));
  }
}

TEST_CASE("the tensor list in the header is validated") {
  const Group group({500, 600});
  const std::vector<TensorDelta> deltas = group.Deltas();
  Delta delta;
  // Effort 0 codes XOR streams: a short frame whose header is easy to take apart.
  Options xor_streams = SmallChunks();
  xor_streams.effort = 0;
  REQUIRE(delta_compress_tensors(deltas.data(), deltas.size(), &delta, xor_streams).ok());
  REQUIRE(delta.bytes[4] == kFormatVersion);
  // magic(4) version flags count(2: 1100) log | tensor count, list check (4) | ...
  const size_t list_at = 9;
  REQUIRE(delta.bytes[list_at] == 2);
  std::vector<uint16_t> a(500), b(600);
  const std::vector<TensorOut> slots = {{group.src[0].data(), a.data(), 500},
                                        {group.src[1].data(), b.data(), 600}};
  const auto decode = [&](const std::vector<uint8_t>& bytes) {
    return delta_decompress_tensors(slots.data(), slots.size(), bytes.data(), bytes.size(),
                                    delta.checksum)
        .code();
  };
  const auto with = [](std::vector<uint8_t> bytes, size_t at, uint8_t value) {
    bytes[at] = value;
    return bytes;
  };
  CHECK(decode(delta.bytes) == ErrorCode::kOk);
  // Any other check, or count, is not this call's list.
  for (size_t at = list_at; at < list_at + 5; ++at) {
    CHECK(decode(with(delta.bytes, at, delta.bytes[at] ^ 0x10)) == ErrorCode::kSizeMismatch);
  }
  // Version 1 (ARCv3 as published) has no flags.
  CHECK(decode(with(delta.bytes, 4, kFormatVersionArcV3)) == ErrorCode::kReservedBitsSet);
  // Claiming to be a session payload: its "session fields" are the tensor list.
  CHECK(decode(with(delta.bytes, 5, kFlagTensors | kFlagSession)) != ErrorCode::kOk);
  for (size_t cut = 0; cut < list_at + 5; ++cut) {
    const std::vector<uint8_t> head(delta.bytes.begin(), delta.bytes.begin() + cut);
    CHECK(decode(head) == ErrorCode::kTruncated);
  }
}

TEST_CASE("bad arguments") {
  const Group group({100, 100});
  std::vector<TensorDelta> deltas = group.Deltas();
  Delta delta;
  Options published;
  published.format = Format::kPublished;
  CHECK(delta_compress_tensors(deltas.data(), deltas.size(), &delta, published).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(delta_compress_tensors(nullptr, 2, &delta).code() == ErrorCode::kInvalidArgument);
  deltas[1].dst = nullptr;
  CHECK(delta_compress_tensors(deltas.data(), deltas.size(), &delta).code() ==
        ErrorCode::kInvalidArgument);
  // No tensors at all is a valid, empty group.
  REQUIRE(delta_compress_tensors(nullptr, 0, &delta).ok());
  CHECK(delta_decompress_tensors(nullptr, 0, delta.bytes.data(), delta.bytes.size(), delta.checksum)
            .ok());
  TensorOut null_out{group.src[0].data(), nullptr, 100};
  CHECK(
      delta_decompress_tensors(&null_out, 1, delta.bytes.data(), delta.bytes.size(), delta.checksum)
          .code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("delta_worth_grouping: small tensors with few changes") {
  // `changes` elements changed, the last ones of the tensor (past the first slice the
  // count is taken in).
  const auto tensor = [](size_t count, size_t changes, std::vector<uint16_t>* src,
                         std::vector<uint16_t>* dst) {
    src->assign(count, 0x3C00);
    *dst = *src;
    for (size_t i = count - changes; i < count; ++i) (*dst)[i] = 0x3C01;
  };
  std::vector<uint16_t> src, dst;
  const size_t small = kGroupBelowElements - 1;
  tensor(small, kGroupMaxChanges - 1, &src, &dst);
  CHECK(delta_worth_grouping(src.data(), dst.data(), small));
  tensor(small, kGroupMaxChanges, &src, &dst);
  CHECK_FALSE(delta_worth_grouping(src.data(), dst.data(), small));
  tensor(kGroupBelowElements, 0, &src, &dst);
  CHECK_FALSE(delta_worth_grouping(src.data(), dst.data(), src.size()));
  CHECK(delta_worth_grouping(src.data(), dst.data(), small));
  CHECK(delta_worth_grouping(nullptr, nullptr, 0));
  CHECK_FALSE(delta_worth_grouping(nullptr, dst.data(), 10));
  CHECK_FALSE(delta_worth_grouping(src.data(), nullptr, 10));
}

}  // namespace
}  // namespace arc_v3

// Tests of the rANS chunk coder (src/codec/rans_coder.h): exact round trips on random and
// structured data, lengths around the 16-lane groups and the decoder's 4096-element
// slices, determinism, robustness against truncated / flipped / arbitrary bytes and a
// wrong base, and that on dense realistic updates it stays close to the modelled coder.
#include "src/codec/rans_coder.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "src/codec/kernels.h"
#include "src/codec/model_coder.h"
#include "tests/codec/chunk_coder_cases.h"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

using test::GaussianWeights;
using test::Step;

// Where a chunk's Element_Words varint starts: after Class_Base, Change_Q,
// Value_Log and Value_Slope.
constexpr size_t kElementWordsAt = 1 + 16 + 4 + 2;

// The changed positions of a pair, ascending.
std::vector<uint32_t> ChangedPositions(const std::vector<uint16_t>& src,
                                       const std::vector<uint16_t>& dst) {
  std::vector<uint32_t> positions;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] != dst[i]) positions.push_back(static_cast<uint32_t>(i));
  }
  return positions;
}

// Encodes (which needs at least one change), checks that decoding gives exactly the
// changed positions and their XORs, and that encoding is deterministic. With a history,
// *used says whether the coding took it (a chunk then decodes only with it).
std::vector<uint8_t> CheckRoundTrip(const std::vector<uint16_t>& src,
                                    const std::vector<uint16_t>& dst,
                                    const uint8_t* history = nullptr, bool* used = nullptr) {
  REQUIRE(src.size() == dst.size());
  const std::vector<uint32_t> want_positions = ChangedPositions(src, dst);
  REQUIRE(!want_positions.empty());
  std::vector<uint8_t> bytes = {0xAB};  // appends: a prefix must survive
  bool with_history = true;
  REQUIRE(EncodeChunkRans(src.data(), dst.data(), src.size(), want_positions.data(),
                          want_positions.size(), &bytes, nullptr, history, &with_history)
              .ok());
  if (history == nullptr) CHECK(!with_history);
  if (used != nullptr) *used = with_history;
  REQUIRE(bytes[0] == 0xAB);
  bytes.erase(bytes.begin());
  std::vector<uint8_t> again;
  REQUIRE(EncodeChunkRans(src.data(), dst.data(), src.size(), want_positions.data(),
                          want_positions.size(), &again, nullptr, history)
              .ok());
  CHECK(again == bytes);

  std::vector<uint32_t> positions = {7, 7};  // stale contents must be replaced
  std::vector<uint16_t> xors = {1};
  const Status d = DecodeChunkRans(src.data(), src.size(), bytes.data(), bytes.size(), &positions,
                                   &xors, with_history ? history : nullptr);
  REQUIRE_MESSAGE(d.ok(), d.ToString());
  std::vector<uint16_t> want_xors;
  for (const uint32_t p : want_positions) want_xors.push_back(src[p] ^ dst[p]);
  CHECK(positions == want_positions);
  CHECK(xors == want_xors);
  return bytes;
}

// What a decoder may return for untrusted bytes: an error with empty outputs, or a
// well-formed result.
void CheckSane(const std::vector<uint16_t>& src, const uint8_t* bytes, size_t size,
               const uint8_t* history = nullptr) {
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  const Status s = DecodeChunkRans(src.data(), src.size(), bytes, size, &positions, &xors, history);
  if (!s.ok()) {
    CHECK((s.code() == ErrorCode::kCorruptChunk || s.code() == ErrorCode::kTruncated));
    CHECK(positions.empty());
    CHECK(xors.empty());
    return;
  }
  REQUIRE(positions.size() == xors.size());
  REQUIRE(!positions.empty());
  for (size_t k = 0; k < positions.size(); ++k) {
    CHECK(positions[k] < src.size());
    if (k > 0) CHECK(positions[k] > positions[k - 1]);
    CHECK(xors[k] != 0);
  }
}

// The cases rans_coder_test.cc shares with model_coder_test.cc.
const chunk_coder_cases::ChunkCoder kRansCoder = {
    [](const std::vector<uint16_t>& src, const std::vector<uint16_t>& dst) {
      return CheckRoundTrip(src, dst);
    },
    [](const std::vector<uint16_t>& src, const uint8_t* bytes, size_t size) {
      CheckSane(src, bytes, size);
    },
    /*max_junk=*/120};

TEST_CASE("Round trips: lengths around lane groups and decoder slices") {
  std::mt19937 rng(1);
  for (size_t n : {1, 2, 15, 16, 17, 31, 33, 100, 4095, 4096, 4097, 8192 + 5, 20000}) {
    INFO("n = " << n);
    const std::vector<uint16_t> src = GaussianWeights(n, &rng);
    std::vector<uint16_t> dst = src;
    dst[n - 1] ^= 1;  // one change, in the last lane group
    CheckRoundTrip(src, dst);
    dst[0] ^= 0x40;
    CheckRoundTrip(src, dst);
    for (float lr : {3e-5f, 3e-4f, 3e-3f}) {
      dst = Step(src, lr, &rng);
      if (!ChangedPositions(src, dst).empty()) CheckRoundTrip(src, dst);
    }
  }
}

TEST_CASE("Round trips: everything changed, arbitrary bit patterns, sign flips") {
  chunk_coder_cases::CheckEverythingChanged(kRansCoder);
}

TEST_CASE("Round trips: +-0, NaN, Inf, denormals, exponent carries and the extreme steps") {
  chunk_coder_cases::CheckSpecialValues(kRansCoder);
}

TEST_CASE("Bad arguments") {
  const std::vector<uint16_t> v = {1, 2, 3};
  const uint32_t position = 0;
  std::vector<uint8_t> out;
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  CHECK(EncodeChunkRans(nullptr, v.data(), 3, &position, 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkRans(v.data(), nullptr, 3, &position, 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkRans(v.data(), v.data(), 3, nullptr, 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkRans(v.data(), v.data(), 3, &position, 0, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkRans(v.data(), v.data(), kMaxRansChunk + 1, &position, 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(out.empty());
  const uint8_t byte = 0;
  CHECK(DecodeChunkRans(nullptr, 3, &byte, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkRans(v.data(), 3, nullptr, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkRans(v.data(), 3, &byte, 1, nullptr, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkRans(v.data(), kMaxRansChunk + 1, &byte, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("Malformed chunks are rejected") {
  std::mt19937 rng(4);
  const std::vector<uint16_t> src = GaussianWeights(5000, &rng);
  const std::vector<uint16_t> dst = Step(src, 1e-3f, &rng);
  const std::vector<uint8_t> good = CheckRoundTrip(src, dst);
  const auto decode = [&](const std::vector<uint8_t>& bytes) {
    std::vector<uint32_t> positions;
    std::vector<uint16_t> xors;
    return DecodeChunkRans(src.data(), src.size(), bytes.data(), bytes.size(), &positions, &xors)
        .code();
  };
  const size_t words_at = kElementWordsAt;
  size_t states_at = words_at;
  while (good[states_at] & 0x80) ++states_at;
  ++states_at;
  REQUIRE(states_at - words_at == 2);
  std::vector<uint8_t> bad = good;
  bad.push_back(0);  // odd escape stream
  CHECK(decode(bad) == ErrorCode::kCorruptChunk);
  bad.push_back(0);  // a word the decoder does not reach
  CHECK(decode(bad) == ErrorCode::kCorruptChunk);
  bad = good;
  bad[words_at] = 0xFF;  // Element_Words: beyond the chunk
  bad[words_at + 1] = 0x7F;
  CHECK(decode(bad) == ErrorCode::kTruncated);
  bad = good;
  for (int i = 0; i < 4; ++i) bad[states_at + i] = 0;  // an element state below 2^16
  CHECK(decode(bad) == ErrorCode::kCorruptChunk);
  CHECK(decode(std::vector<uint8_t>(good.begin(), good.begin() + 22)) == ErrorCode::kTruncated);
  CHECK(decode(std::vector<uint8_t>(good.begin(), good.begin() + states_at + 63)) ==
        ErrorCode::kTruncated);
  // Changes in zero elements.
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  CHECK(DecodeChunkRans(nullptr, 0, good.data(), good.size(), &positions, &xors).code() ==
        ErrorCode::kCorruptChunk);
}

// The number of words of the element stream, and where they start.
struct ElementStream {
  size_t words;
  size_t words_at;
};
ElementStream ElementStreamOf(const std::vector<uint8_t>& chunk) {
  size_t at = kElementWordsAt;
  uint64_t words = 0;
  for (int shift = 0;; shift += 7) {
    words |= uint64_t{chunk.at(at) & 0x7Fu} << shift;
    if ((chunk[at++] & 0x80) == 0) break;
  }
  return {static_cast<size_t>(words), at + 4 * kRansLanes};
}

TEST_CASE("The escape stream starts in the element states' ends") {
  std::mt19937 rng(7);
  const std::vector<uint16_t> src = GaussianWeights(20000, &rng);
  // Only +-1 steps: the escape stream is its two states (4 of the 16 units the element
  // states carry, the rest zero), so the chunk ends with the element words.
  std::vector<uint16_t> dst = src;
  for (size_t i = 0; i < dst.size(); i += 7) {
    dst[i] = FromMonotoneKey(static_cast<uint16_t>(MonotoneKey(src[i]) + (i % 2 ? 1 : -1)));
  }
  const std::vector<uint8_t> no_escapes = CheckRoundTrip(src, dst);
  const ElementStream stream = ElementStreamOf(no_escapes);
  CHECK(no_escapes.size() == stream.words_at + 2 * stream.words);
  // Any byte after them is a word the escape decoder never reads.
  std::vector<uint8_t> bad = no_escapes;
  bad.push_back(0);
  bad.push_back(0);
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  CHECK(DecodeChunkRans(src.data(), src.size(), bad.data(), bad.size(), &positions, &xors).code() ==
        ErrorCode::kCorruptChunk);
  // Large steps: the escape stream outgrows the 16 units, and the rest follows the
  // element words.
  for (size_t i = 3; i < dst.size(); i += 11) {
    dst[i] = FromMonotoneKey(static_cast<uint16_t>(MonotoneKey(src[i]) + 50 + i % 700));
  }
  const std::vector<uint8_t> escapes = CheckRoundTrip(src, dst);
  const ElementStream with_escapes = ElementStreamOf(escapes);
  CHECK(escapes.size() > with_escapes.words_at + 2 * with_escapes.words + 100);
}

TEST_CASE("Truncated, bit-flipped, arbitrary bytes and a wrong base never crash") {
  chunk_coder_cases::CheckDamagedChunks(kRansCoder);
}

TEST_CASE("On dense realistic updates rANS stays within 3% of the modelled coder") {
  // 2^18 weights, steps that change 2-10% of them: the densities where the encoder's
  // default picks rANS for its decoding speed. Its ~90 header bytes (a third of them
  // carrying escape data) and static probabilities must cost little against the
  // adaptive coder.
  std::mt19937 rng(6);
  const std::vector<uint16_t> src = GaussianWeights(size_t{1} << 18, &rng);
  for (float lr : {2e-6f, 6e-6f}) {
    const std::vector<uint16_t> dst = Step(src, lr, &rng);
    const std::vector<uint32_t> positions = ChangedPositions(src, dst);
    const double density = static_cast<double>(positions.size()) / src.size();
    INFO("density " << density);
    REQUIRE(density > 0.02);
    REQUIRE(density < 0.12);
    std::vector<uint8_t> rans, modelled;
    REQUIRE(EncodeChunkRans(src.data(), dst.data(), src.size(), positions.data(), positions.size(),
                            &rans)
                .ok());
    REQUIRE(EncodeChunkModelled(src.data(), dst.data(), src.size(), &modelled).ok());
    MESSAGE("density ", density, ": rANS ", rans.size(), " bytes, modelled ", modelled.size());
    CHECK(rans.size() < modelled.size() * 1.03);
    CheckRoundTrip(src, dst);
  }
}

// Two steps of a session: step 1 changes ~3% of src's elements; the step after it
// (src -> dst, the one coded) changes half of those again, in the same direction for
// most, and 1% of the others. `history` gets step 1's record, as AdvanceHistory keeps it.
struct SessionStep {
  std::vector<uint16_t> src, dst;
  std::vector<uint8_t> history;
};
SessionStep MakeSessionStep(size_t n, std::mt19937* rng) {
  SessionStep step;
  const std::vector<uint16_t> before = GaussianWeights(n, rng);
  step.src = before;
  std::uniform_real_distribution<double> uniform(0, 1);
  const auto moved = [](uint16_t bits, bool up) {
    return FromMonotoneKey(static_cast<uint16_t>(MonotoneKey(bits) + (up ? 1 : -1)));
  };
  for (auto& v : step.src) {
    if (uniform(*rng) < 0.03) v = moved(v, uniform(*rng) < 0.5);
  }
  step.history.assign(n, 0);
  AdvanceHistory(before.data(), step.src.data(), n, step.history.data());
  step.dst = step.src;
  for (size_t i = 0; i < n; ++i) {
    const bool recorded = (step.history[i] & kHistoryAgeMask) != 0;
    const bool went_up = (step.history[i] & kHistoryUp) != 0;
    if (recorded && uniform(*rng) < 0.5) {
      step.dst[i] = moved(step.src[i], uniform(*rng) < 0.9 ? went_up : !went_up);
    } else if (!recorded && uniform(*rng) < 0.01) {
      step.dst[i] = moved(step.src[i], uniform(*rng) < 0.5);
    } else if (uniform(*rng) < 0.001) {
      step.dst[i] = static_cast<uint16_t>(step.src[i] ^ 0x0005);  // escapes too
    }
  }
  return step;
}

TEST_CASE("With a session history: round trips, smaller than without, and needs it") {
  std::mt19937 rng(7);
  for (size_t n : {size_t{1}, size_t{17}, size_t{4097}, size_t{1} << 17}) {
    INFO("n = " << n);
    SessionStep step = MakeSessionStep(n, &rng);
    step.dst[n - 1] ^= 1;  // at least one change
    bool used = false;
    const std::vector<uint8_t> with =
        CheckRoundTrip(step.src, step.dst, step.history.data(), &used);
    const std::vector<uint8_t> without = CheckRoundTrip(step.src, step.dst);
    // The history's 64 header bytes are spent only where they pay.
    CHECK(with.size() <= without.size());
    if (!used) CHECK(with == without);
    if (n == (size_t{1} << 17)) {
      MESSAGE("with history ", with.size(), " bytes, without ", without.size());
      CHECK(used);
      CHECK(with.size() < without.size() * 0.9);
    }
    if (n == 1) CHECK(!used);
    // Any history bytes at all, high bits included.
    std::vector<uint8_t> any_history(n);
    for (auto& h : any_history) h = static_cast<uint8_t>(rng());
    CheckRoundTrip(step.src, step.dst, any_history.data());
    // Read without its history, or with another one: a wrong result or an error.
    CheckSane(step.src, with.data(), with.size());
    CheckSane(step.src, with.data(), with.size(), any_history.data());
  }
}

TEST_CASE("With a session history: damaged chunks never crash") {
  std::mt19937 rng(8);
  const SessionStep step = MakeSessionStep(30000, &rng);
  bool used = false;
  const std::vector<uint8_t> good = CheckRoundTrip(step.src, step.dst, step.history.data(), &used);
  REQUIRE(used);
  test::ForEachDamagedChunk(good, 120, &rng, [&](const uint8_t* bytes, size_t size) {
    CheckSane(step.src, bytes, size, step.history.data());
  });
}

}  // namespace
}  // namespace arc_v3

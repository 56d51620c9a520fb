// Tests of the context-modelled chunk coder (src/codec/model_coder.h): the monotone key, exact
// round trips on random and structured data for every block size, determinism, robustness
// against truncated / flipped / arbitrary bytes, that the model beats a plain
// positions-and-mantissas baseline on realistic updates, and the session history.
#include "src/codec/model_coder.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/codec/chunk_coder_cases.h"
#include "tests/test_data.h"

namespace arc_v3 {
namespace {

using test::ColumnCoherentStep;
using test::GaussianWeights;
using test::Step;

struct Decoded {
  Status status;
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
};

Decoded Decode(const std::vector<uint16_t>& src, const std::vector<uint8_t>& bytes) {
  Decoded result;
  result.status = DecodeChunkModelled(src.data(), src.size(), bytes.data(), bytes.size(),
                                      &result.positions, &result.xors);
  return result;
}

// Encodes with the given block size (0: the encoder's choice), checks that decoding gives
// exactly the changed positions and their XORs, and that encoding is deterministic.
std::vector<uint8_t> CheckRoundTrip(const std::vector<uint16_t>& src,
                                    const std::vector<uint16_t>& dst, int log2_block = 0,
                                    const uint8_t* history = nullptr,
                                    const std::vector<uint32_t>* sign_periods = nullptr) {
  REQUIRE(src.size() == dst.size());
  const auto encode = [&](std::vector<uint8_t>* out) {
    return log2_block == 0 ? EncodeChunkModelled(src.data(), dst.data(), src.size(), out, history,
                                                 kUncounted, CarriedModel(), sign_periods)
                           : EncodeChunkModelledWithBlock(src.data(), dst.data(), src.size(),
                                                          log2_block, out, history);
  };
  std::vector<uint8_t> bytes = {0xAB};  // appends: a prefix must survive
  REQUIRE(encode(&bytes).ok());
  REQUIRE(bytes[0] == 0xAB);
  bytes.erase(bytes.begin());

  std::vector<uint8_t> again;
  REQUIRE(encode(&again).ok());
  CHECK(again == bytes);

  std::vector<uint32_t> positions = {7, 7};  // stale contents must be replaced
  std::vector<uint16_t> xors = {1};
  const Status d = DecodeChunkModelled(src.data(), src.size(), bytes.data(), bytes.size(),
                                       &positions, &xors, history);
  REQUIRE(d.ok());
  std::vector<uint32_t> want_positions;
  std::vector<uint16_t> want_xors;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] != dst[i]) {
      want_positions.push_back(static_cast<uint32_t>(i));
      want_xors.push_back(static_cast<uint16_t>(src[i] ^ dst[i]));
    }
  }
  CHECK(positions == want_positions);
  CHECK(xors == want_xors);
  return bytes;
}

// Round trips with the encoder's block size and every other; returns the bytes of the
// former.
std::vector<uint8_t> CheckAllBlockSizes(const std::vector<uint16_t>& src,
                                        const std::vector<uint16_t>& dst) {
  std::vector<uint8_t> bytes = CheckRoundTrip(src, dst);
  for (int b = kMinModelBlockLog; b <= kMaxModelBlockLog; ++b) {
    INFO("log2_block = " << b);
    CheckRoundTrip(src, dst, b);
  }
  return bytes;
}

// Checks what a decoder may return for untrusted bytes: an error with empty outputs, or
// a well-formed result.
// Decodes BYTES and checks that the result is sane; returns the decoder's status.
Status CheckSane(const std::vector<uint16_t>& src, const uint8_t* bytes, size_t size,
                 const uint8_t* history = nullptr, const CarriedModel& carried = CarriedModel()) {
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  const Status s =
      DecodeChunkModelled(src.data(), src.size(), bytes, size, &positions, &xors, history, carried);
  if (!s.ok()) {
    CHECK((s.code() == ErrorCode::kCorruptChunk || s.code() == ErrorCode::kTruncated));
    CHECK(positions.empty());
    CHECK(xors.empty());
    return s;
  }
  REQUIRE(positions.size() == xors.size());
  for (size_t k = 0; k < positions.size(); ++k) {
    CHECK(positions[k] < src.size());
    if (k > 0) CHECK(positions[k] > positions[k - 1]);
    CHECK(xors[k] != 0);
  }
  return s;
}

// The cases model_coder_test.cc shares with rans_coder_test.cc.
const chunk_coder_cases::ChunkCoder kModelledCoder = {
    CheckAllBlockSizes,
    [](const std::vector<uint16_t>& src, const uint8_t* bytes, size_t size) {
      (void)CheckSane(src, bytes, size);
    },
    /*max_junk=*/40};

TEST_CASE("MonotoneKey is a bijection that orders values, with +-0 adjacent") {
  std::vector<bool> seen(65536, false);
  for (uint32_t x = 0; x < 65536; ++x) {
    const uint16_t key = MonotoneKey(static_cast<uint16_t>(x));
    CHECK_FALSE(seen[key]);
    seen[key] = true;
    CHECK(FromMonotoneKey(key) == x);
  }
  // Consecutive keys are consecutive values (NaNs excluded: they have no order).
  for (uint32_t key = 0; key + 1 < 65536; ++key) {
    const float a = test::FloatFromBf16(FromMonotoneKey(static_cast<uint16_t>(key)));
    const float b = test::FloatFromBf16(FromMonotoneKey(static_cast<uint16_t>(key + 1)));
    if (std::isnan(a) || std::isnan(b)) continue;
    if (a == 0.0f && b == 0.0f) {
      CHECK(std::signbit(a));  // -0 then +0
      CHECK_FALSE(std::signbit(b));
      continue;
    }
    CHECK(a < b);
  }
  CHECK(MonotoneKey(0x0000) == MonotoneKey(0x8000) + 1);  // -0 -> +0
  CHECK(MonotoneKey(0x3F80) == MonotoneKey(0x3F7F) + 1);  // carry into the exponent
  CHECK(MonotoneKey(0xBF80) + 1 == MonotoneKey(0xBF7F));  // and on the negative side
  CHECK(MonotoneKey(0x7F80) + 1 == MonotoneKey(0x7F81));  // +Inf -> NaN
}

TEST_CASE("Round trips: sizes 0, 1, odd, and every block size") {
  std::mt19937 rng(1);
  for (size_t n : {0, 1, 2, 3, 5, 7, 31, 33, 63, 65, 127, 129, 255, 257, 1001}) {
    INFO("n = " << n);
    const std::vector<uint16_t> src = GaussianWeights(n, &rng);
    std::vector<uint16_t> dst = src;
    CHECK(CheckRoundTrip(src, dst).empty());  // nothing changed: the empty chunk
    if (n == 0) continue;
    dst[n - 1] ^= 1;
    CheckAllBlockSizes(src, dst);
    dst[0] ^= 0x40;
    CheckAllBlockSizes(src, dst);
    CheckAllBlockSizes(src, Step(src, 3e-4f, &rng));
  }
}

TEST_CASE("Round trips: everything changed, arbitrary bit patterns, sign flips") {
  chunk_coder_cases::CheckEverythingChanged(kModelledCoder);
}

TEST_CASE("Round trips: +-0, NaN, Inf, denormals, exponent carries and the extreme steps") {
  chunk_coder_cases::CheckSpecialValues(kModelledCoder);
}

TEST_CASE("Round trips: a large sparse chunk and a dense one") {
  std::mt19937 rng(3);
  const std::vector<uint16_t> src = GaussianWeights(kMaxModelledChunk >> 4, &rng);
  for (float lr : {2e-5f, 3e-4f, 3e-3f}) {
    INFO("lr = " << lr);
    CheckRoundTrip(src, Step(src, lr, &rng));
  }
}

TEST_CASE("Bad arguments") {
  const std::vector<uint16_t> v = {1, 2, 3};
  std::vector<uint8_t> out;
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  CHECK(EncodeChunkModelled(nullptr, v.data(), 3, &out).code() == ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkModelled(v.data(), nullptr, 3, &out).code() == ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkModelled(v.data(), v.data(), 3, nullptr).code() == ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkModelled(v.data(), v.data(), kMaxModelledChunk + 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkModelledWithBlock(v.data(), v.data(), 3, kMaxModelBlockLog + 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(EncodeChunkModelledWithBlock(v.data(), v.data(), 3, kMinModelBlockLog - 1, &out).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(out.empty());
  const uint8_t byte = 0;
  CHECK(DecodeChunkModelled(nullptr, 3, &byte, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkModelled(v.data(), 3, nullptr, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkModelled(v.data(), 3, &byte, 1, nullptr, &xors).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(DecodeChunkModelled(v.data(), kMaxModelledChunk + 1, &byte, 1, &positions, &xors).code() ==
        ErrorCode::kInvalidArgument);
  // Zero elements decode from zero bytes only.
  CHECK(DecodeChunkModelled(nullptr, 0, nullptr, 0, &positions, &xors).ok());
  CHECK(positions.empty());
}

TEST_CASE("Malformed chunks are rejected") {
  std::mt19937 rng(4);
  const std::vector<uint16_t> src = GaussianWeights(500, &rng);
  const std::vector<uint16_t> dst = Step(src, 3e-4f, &rng);
  const std::vector<uint8_t> good = CheckRoundTrip(src, dst);
  REQUIRE(good.size() > 2);

  std::vector<uint8_t> bad = good;
  bad[0] = (bad[0] & ~0x07) | 0x07;  // block size 2^9: beyond the maximum
  CHECK(Decode(src, bad).status.code() == ErrorCode::kCorruptChunk);
  bad = good;
  bad.push_back(0);  // the encoder never ends a stream in a zero byte
  CHECK(Decode(src, bad).status.code() == ErrorCode::kCorruptChunk);
  bad = good;
  bad.insert(bad.end(), 64, 0x5A);  // bytes the decoder does not reach
  CHECK(Decode(src, bad).status.code() == ErrorCode::kCorruptChunk);
  CHECK(Decode(src, {good[0]}).status.code() == ErrorCode::kTruncated);
  // Changes in zero elements.
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  CHECK(DecodeChunkModelled(nullptr, 0, good.data(), good.size(), &positions, &xors).code() ==
        ErrorCode::kCorruptChunk);
}

// The Rate_Cap byte of a chunk (layout bit 7), or -1 without one. It follows the boosts
// (layout bit 3) and the sign period (bit 6), if any.
int RateCapOf(const std::vector<uint8_t>& chunk) {
  if ((chunk[0] & kModelRateCap) == 0) return -1;
  const size_t at =
      2 + ((chunk[0] & kModelHistory) ? 1 : 0) + ((chunk[0] & kModelColumnSigns) ? 2 : 0);
  return chunk[at];
}

TEST_CASE("Rate caps: written where they change a rate, raised on very sparse chunks") {
  std::mt19937 rng(41);
  std::vector<uint16_t> src = GaussianWeights(20000, &rng);
  // Without an element of rate above 2^24 (a weight below 2^-16), no cap.
  for (uint16_t& w : src) {
    if (((w >> 7) & 0xFF) < kRateTopExponent - 24) w = 0x3C00;
  }
  const std::vector<uint16_t> plain_dst = Step(src, 3e-4f, &rng);
  CHECK(RateCapOf(CheckRoundTrip(src, plain_dst)) == -1);
  // With zeros and denormals (rate 2^32) the default cap, 24.
  for (size_t i = 0; i < src.size(); i += 997) {
    src[i] = static_cast<uint16_t>(i % 3 == 0 ? 0x0001 : 0x8000);
  }
  std::vector<uint16_t> dst = Step(src, 3e-4f, &rng);
  dst[997] = 0x0000;  // -0 -> +0, and a denormal that grows
  dst[2 * 997] = 0x0003;
  const std::vector<uint8_t> capped = CheckRoundTrip(src, dst);
  CHECK(RateCapOf(capped) == 24);
  // The same with a session history and with column signs (the cap byte comes last).
  std::vector<uint8_t> history(src.size(), 0);
  for (size_t i = 0; i < src.size(); i += 7) history[i] = static_cast<uint8_t>(1 + i % 3);
  CHECK(RateCapOf(CheckRoundTrip(src, dst, 0, history.data())) == 24);
  const std::vector<uint32_t> periods = SignPeriodCandidates(src.size());
  const std::vector<uint16_t> columns = ColumnCoherentStep(src, 100, 0.02, 0.95, &rng);
  const std::vector<uint8_t> with_columns = CheckRoundTrip(src, columns, 0, nullptr, &periods);
  CHECK((with_columns[0] & kModelColumnSigns) != 0);
  CHECK(RateCapOf(with_columns) == 24);
  // One change in 2^16 weights of rate 2^10 (and a zero): an element of rate 2^26 would
  // change about once a step, so the cap moves two octaves above, to 28 ...
  std::vector<uint16_t> sparse_src(1 << 16, 0x3E00);  // 0.125: exponent 124, rate log 10
  sparse_src[5] = 0x0000;                             // rate log 32
  std::vector<uint16_t> sparse_dst = sparse_src;
  sparse_dst[100] = 0x3E01;
  CHECK(RateCapOf(CheckRoundTrip(sparse_src, sparse_dst)) == 28);
  // ... where no rate exceeds that (here 2^27 at most), no cap is written.
  sparse_src[5] = sparse_dst[5] = 107 << 7;
  CHECK(RateCapOf(CheckRoundTrip(sparse_src, sparse_dst)) == -1);

  // Malformed: a cap above 32, a header that ends before the cap byte.
  std::vector<uint8_t> bad = capped;
  bad[2] = 33;
  CHECK(Decode(src, bad).status.code() == ErrorCode::kCorruptChunk);
  CHECK(Decode(src, {capped[0], capped[1]}).status.code() == ErrorCode::kTruncated);
  // Any cap in range decodes to something well-formed (or an error), never a crash.
  for (int cap = 0; cap <= 32; ++cap) {
    bad[2] = static_cast<uint8_t>(cap);
    (void)CheckSane(src, bad.data(), bad.size());
  }
}

TEST_CASE("Truncated, bit-flipped, arbitrary bytes and a wrong base never crash") {
  chunk_coder_cases::CheckDamagedChunks(kModelledCoder);
}

TEST_CASE("On realistic updates the model beats 7-bit mantissas plus gap varints") {
  std::mt19937 rng(6);
  const std::vector<uint16_t> src = GaussianWeights(1 << 18, &rng);
  // Update sizes that change roughly 0.2% to 10% of the weights.
  for (float lr : {2e-7f, 1e-6f, 5e-6f}) {
    INFO("lr = " << lr);
    const std::vector<uint16_t> dst = Step(src, lr, &rng);
    size_t changes = 0, baseline = 0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < src.size(); ++i) {
      if (src[i] == dst[i]) continue;
      uint32_t gap = i - last;
      last = i + 1;
      do {
        ++baseline;
        gap >>= 7;
      } while (gap != 0);
      ++changes;
    }
    baseline += (7 * changes + 7) / 8;
    REQUIRE(changes > 0);
    const std::vector<uint8_t> bytes = CheckRoundTrip(src, dst);
    MESSAGE("changes " << changes << ": model " << bytes.size() << " bytes, baseline " << baseline);
    CHECK(bytes.size() < baseline);
  }
}

TEST_CASE("Sign period candidates: the possible row lengths") {
  const std::vector<uint32_t> wte = SignPeriodCandidates(6625 * 120);
  REQUIRE(!wte.empty());
  CHECK(wte.front() == 1);
  CHECK(std::is_sorted(wte.begin(), wte.end()));
  CHECK(std::find(wte.begin(), wte.end(), 120u) != wte.end());
  CHECK(std::find(wte.begin(), wte.end(), 6625u) != wte.end());
  size_t divisors = 1;  // 1
  for (uint32_t d = 8; d <= 65535; ++d) divisors += (6625 * 120) % d == 0;
  CHECK(wte.size() == divisors);
  for (const uint32_t p : wte) CHECK(((6625 * 120) % p == 0 && (p == 1 || p >= 8)));
  CHECK(SignPeriodCandidates(65537) == std::vector<uint32_t>{1});  // a prime
  CHECK(SignPeriodCandidates(1).empty());
  CHECK(SignPeriodCandidates(0).empty());
  std::vector<uint32_t> powers = {1};
  for (uint32_t p = 8; p <= 32768; p *= 2) powers.push_back(p);
  CHECK(SignPeriodCandidates(uint64_t{1} << 20) == powers);
  // A large prime factor beyond the limit: only the small ones count.
  CHECK(SignPeriodCandidates(uint64_t{4294967291} * 16) == std::vector<uint32_t>{1, 8, 16});
}

TEST_CASE("Column signs: the encoder finds the row length, round-trips, and pays") {
  std::mt19937 rng(12);
  const size_t rows = 2000, cols = 120;
  const std::vector<uint16_t> src = GaussianWeights(rows * cols, &rng);
  const std::vector<uint16_t> dst = ColumnCoherentStep(src, cols, 0.005, 0.9, &rng);
  const std::vector<uint32_t> periods = SignPeriodCandidates(src.size());
  const std::vector<uint8_t> plain = CheckRoundTrip(src, dst);
  CHECK((plain[0] & kModelColumnSigns) == 0);  // no candidates, no column signs
  const std::vector<uint8_t> columns = CheckRoundTrip(src, dst, 0, nullptr, &periods);
  REQUIRE(columns.size() > 4);
  CHECK((columns[0] & kModelColumnSigns) != 0);
  CHECK((columns[2] | columns[3] << 8) == cols);
  MESSAGE("column signs: " << columns.size() << " bytes, without " << plain.size());
  CHECK(columns.size() + 40 < plain.size());  // ~0.5 of ~1,200 sign bits
  // Signs that ignore their column: no period saves its bytes.
  const std::vector<uint16_t> random_signs = ColumnCoherentStep(src, cols, 0.005, 0.5, &rng);
  CHECK((CheckRoundTrip(src, random_signs, 0, nullptr, &periods)[0] & kModelColumnSigns) == 0);
  // With a session history (its sign hints beside the column counters).
  std::vector<uint8_t> history(src.size());
  for (size_t i = 0; i < history.size(); ++i) {
    history[i] = static_cast<uint8_t>(rng() % 37 == 0 ? 1 + rng() % 15 : 0);
  }
  const std::vector<uint8_t> with_history = CheckRoundTrip(src, dst, 0, history.data(), &periods);
  CHECK((with_history[0] & kModelColumnSigns) != 0);
  CHECK((with_history[3] | with_history[4] << 8) == cols);  // after the boost byte
  for (const int log2_block : {2, 5, 8}) CheckRoundTrip(src, dst, log2_block, nullptr, &periods);

  // Period 0 is invalid; a header cut before the period is truncated.
  std::vector<uint8_t> bad = columns;
  bad[2] = bad[3] = 0;
  CHECK(Decode(src, bad).status.code() == ErrorCode::kCorruptChunk);
  CHECK(Decode(src, {columns.begin(), columns.begin() + 3}).status.code() == ErrorCode::kTruncated);
  // Any other period decodes to something (or fails cleanly), never out of bounds.
  for (const uint32_t period : {1u, 7u, 121u, 65535u}) {
    bad = columns;
    bad[2] = static_cast<uint8_t>(period);
    bad[3] = static_cast<uint8_t>(period >> 8);
    (void)CheckSane(src, bad.data(), bad.size());
  }
  test::ForEachDamagedChunk(columns, 40, &rng, [&](const uint8_t* bytes, size_t size) {
    (void)CheckSane(src, bytes, size);
  });
}

// A session in which each weight follows its own persistent drift (as Adam's momentum
// makes it), so elements that changed tend to change again in the same direction.
struct Session {
  std::vector<std::vector<uint16_t>> steps;
};
Session MakeSession(size_t n, int steps, float lr, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> master(n), drift(n);
  Session session;
  session.steps.push_back(GaussianWeights(n, rng));
  for (size_t i = 0; i < n; ++i) {
    master[i] = test::FloatFromBf16(session.steps[0][i]);
    drift[i] = normal(*rng);
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<uint16_t> next(n);
    for (size_t i = 0; i < n; ++i) {
      master[i] += lr * (drift[i] + 0.3f * normal(*rng));
      next[i] = test::Bf16FromFloat(master[i]);
    }
    session.steps.push_back(std::move(next));
  }
  return session;
}

TEST_CASE("AdvanceHistory records age and direction of the last change") {
  const std::vector<uint16_t> src = {0x3F80, 0x3F80, 0x0000, 0x8000, 0x1234, 0x1234};
  const std::vector<uint16_t> dst = {0x3F81, 0x3F7F, 0x8000, 0x0000, 0x1234, 0x1234};
  std::vector<uint8_t> history = {0, 0x0B, 7, 2, 0x0A, 0x07};
  AdvanceHistory(src.data(), dst.data(), src.size(), history.data());
  CHECK(history[0] == (1 | kHistoryUp));  // up by one
  CHECK(history[1] == 1);                 // down
  CHECK(history[2] == 1);                 // +0 -> -0 is a step down
  CHECK(history[3] == (1 | kHistoryUp));  // -0 -> +0 is a step up
  CHECK(history[4] == 0x0B);              // unchanged: one step older, direction kept
  CHECK(history[5] == 0x07);              // the oldest age saturates
}

TEST_CASE("Sessions: round trips with history, and history pays") {
  std::mt19937 rng(7);
  const size_t n = 1 << 16;
  const Session session = MakeSession(n, 6, 2e-5f, &rng);
  std::vector<uint8_t> history(n, 0);
  size_t with_history = 0, without = 0;
  for (size_t s = 0; s + 1 < session.steps.size(); ++s) {
    const auto& src = session.steps[s];
    const auto& dst = session.steps[s + 1];
    const std::vector<uint8_t> bytes = CheckRoundTrip(src, dst, 0, history.data());
    const std::vector<uint8_t> plain = CheckRoundTrip(src, dst);
    if (s == 0) {
      CHECK(bytes == plain);  // an empty history is not sent
    } else {
      with_history += bytes.size();
      without += plain.size();
      // The chunk needs its history: without it, an error.
      if (!bytes.empty() && (bytes[0] & 0x08)) {
        std::vector<uint32_t> positions;
        std::vector<uint16_t> xors;
        CHECK(DecodeChunkModelled(src.data(), n, bytes.data(), bytes.size(), &positions, &xors)
                  .code() == ErrorCode::kCorruptChunk);
      }
      for (int b = kMinModelBlockLog; b <= kMaxModelBlockLog; ++b) {
        CheckRoundTrip(src, dst, b, history.data());
      }
    }
    AdvanceHistory(src.data(), dst.data(), n, history.data());
  }
  MESSAGE("with history " << with_history << " bytes, without " << without);
  CHECK(with_history < without);
}

TEST_CASE("Sessions: recent elements are coded first") {
  std::mt19937 rng(44);
  const size_t n = 1 << 15;
  const std::vector<uint16_t> src = GaussianWeights(n, &rng);
  const std::vector<uint16_t> step = Step(src, 3e-4f, &rng);
  // Every 40th element changed 1..7 steps ago, up or down.
  std::vector<uint8_t> history(n, 0);
  size_t recent = 0;
  for (size_t i = 0; i < n; i += 40) {
    history[i] = static_cast<uint8_t>((1 + (i / 40) % 7) | ((i / 280) % 2 ? kHistoryUp : 0));
    recent += IsRecent(history[i]);
  }
  REQUIRE(recent > 100);
  // Every element recent: all the bisection's rate is theirs (1 each), and it has no
  // change to place.
  {
    const std::vector<uint16_t> few(src.begin(), src.begin() + 64);
    std::vector<uint16_t> few_dst = few;
    few_dst[5] ^= 1;
    few_dst[60] ^= 0x80;
    const std::vector<uint8_t> all_recent(few.size(), 1);
    CHECK((CheckRoundTrip(few, few_dst, 0, all_recent.data())[0] & kModelHistory) != 0);
  }
  // The recent elements as they are in `step`, all changed (one ULP up), or all unchanged;
  // with the other changes of `step` or none.
  for (const int recent_mode : {0, 1, 2}) {
    for (const bool others : {true, false}) {
      CAPTURE(recent_mode);
      CAPTURE(others);
      std::vector<uint16_t> dst = others ? step : src;
      for (size_t i = 0; i < n; ++i) {
        if (!IsRecent(history[i])) continue;
        dst[i] = recent_mode == 0   ? step[i]
                 : recent_mode == 1 ? static_cast<uint16_t>(src[i] + 1)
                                    : src[i];
      }
      if (dst == src) continue;
      const std::vector<uint8_t> bytes = CheckRoundTrip(src, dst, 0, history.data());
      CHECK((bytes[0] & kModelHistory) != 0);
      for (int b = kMinModelBlockLog; b <= kMaxModelBlockLog; b += 3) {
        CheckRoundTrip(src, dst, b, history.data());
      }
      // Only recent elements changed, all of them: a decision each at a probability
      // learnt on the way, far below coding their positions.
      if (recent_mode == 1 && !others) {
        CHECK(bytes.size() * 3 < CheckRoundTrip(src, dst).size());
      }
    }
  }
}

TEST_CASE("Sessions: a change the bisection places on a recent element is corrupt") {
  // Bit flips in a chunk whose bisection and recent elements share many blocks: some make
  // the bisection emit a recent element, which the decoder must refuse (the merged
  // positions would repeat it).
  std::mt19937 rng(45);
  const size_t n = 4096;
  const std::vector<uint16_t> src = GaussianWeights(n, &rng);
  const std::vector<uint16_t> dst = Step(src, 3e-3f, &rng);
  std::vector<uint8_t> history(n, 0);
  for (size_t i = 0; i < n; i += 3) history[i] = static_cast<uint8_t>(1 + i % 2);
  const std::vector<uint8_t> good = CheckRoundTrip(src, dst, 0, history.data());
  size_t refused = 0;
  for (size_t k = 3; k < good.size() * 8; ++k) {
    std::vector<uint8_t> flipped = good;
    flipped[k / 8] ^= static_cast<uint8_t>(1 << (k % 8));
    const Status s = CheckSane(src, flipped.data(), flipped.size(), history.data());
    refused += s.message().find("recently changed") != std::string::npos;
  }
  MESSAGE(refused << " of " << good.size() * 8 - 3 << " flips placed a change on a recent element");
  CHECK(refused > 0);
}

TEST_CASE("Sessions: corrupt bytes and arbitrary history never crash") {
  std::mt19937 rng(8);
  const Session session = MakeSession(200, 2, 1e-4f, &rng);
  std::vector<uint8_t> history(200, 0);
  AdvanceHistory(session.steps[0].data(), session.steps[1].data(), 200, history.data());
  const auto& src = session.steps[1];
  const std::vector<uint8_t> good = CheckRoundTrip(src, session.steps[2], 0, history.data());
  for (size_t size = 0; size < good.size(); ++size) {
    (void)CheckSane(src, good.data(), size, history.data());
  }
  std::vector<uint8_t> flipped = good;
  for (size_t bit = 0; bit < 8 * good.size(); ++bit) {
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    (void)CheckSane(src, flipped.data(), flipped.size(), history.data());
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> junk_history(200);
  for (auto& h : junk_history) h = static_cast<uint8_t>(byte(rng));
  (void)CheckSane(src, good.data(), good.size(), junk_history.data());
  CheckRoundTrip(src, session.steps[2], 0, junk_history.data());  // any history codes
}

TEST_CASE("Sessions: a carried model round-trips, pays, and is needed to decode") {
  std::mt19937 rng(9);
  const size_t n = 1 << 16;
  const Session session = MakeSession(n, 6, 2e-5f, &rng);
  std::vector<uint8_t> history(n, 0);
  ModelStatePtr carried;  // what the previous step ended on, sender and receiver alike
  size_t with_carried = 0, without = 0;
  for (size_t s = 0; s + 1 < session.steps.size(); ++s) {
    CAPTURE(s);
    const auto& src = session.steps[s];
    const auto& dst = session.steps[s + 1];
    const uint8_t* step_history = s > 0 ? history.data() : nullptr;
    ModelStatePtr sender_end, receiver_end;
    std::vector<uint8_t> bytes;
    REQUIRE(EncodeChunkModelled(src.data(), dst.data(), n, &bytes, step_history, kUncounted,
                                {carried.get(), &sender_end})
                .ok());
    REQUIRE(!bytes.empty());
    CHECK(((bytes[0] & kModelCarried) != 0) == (carried != nullptr));
    std::vector<uint32_t> positions;
    std::vector<uint16_t> xors;
    REQUIRE(DecodeChunkModelled(src.data(), n, bytes.data(), bytes.size(), &positions, &xors,
                                step_history, {carried.get(), &receiver_end})
                .ok());
    std::vector<uint16_t> rebuilt = src;
    for (size_t k = 0; k < positions.size(); ++k) rebuilt[positions[k]] ^= xors[k];
    CHECK(rebuilt == dst);
    REQUIRE(sender_end != nullptr);
    REQUIRE(receiver_end != nullptr);
    if (carried != nullptr) {
      with_carried += bytes.size();
      std::vector<uint8_t> fresh;
      REQUIRE(EncodeChunkModelled(src.data(), dst.data(), n, &fresh, step_history).ok());
      without += fresh.size();
      // Without the carried model the chunk cannot be decoded.
      CHECK(DecodeChunkModelled(src.data(), n, bytes.data(), bytes.size(), &positions, &xors,
                                step_history)
                .code() == ErrorCode::kCorruptChunk);
      CHECK(positions.empty());
      // Corrupt bytes decoded from a carried model: an error or a well-formed result.
      std::vector<uint8_t> flipped = bytes;
      for (size_t bit = 0; bit < 8 * std::min<size_t>(bytes.size(), 64); ++bit) {
        flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        (void)CheckSane(src, flipped.data(), flipped.size(), step_history,
                        {carried.get(), nullptr});
        flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
    }
    // Both sides end on the same model: coding the next step from either gives the same
    // bytes.
    if (s + 2 < session.steps.size()) {
      std::vector<uint8_t> from_sender, from_receiver;
      const auto& next = session.steps[s + 2];
      REQUIRE(EncodeChunkModelled(dst.data(), next.data(), n, &from_sender, nullptr, kUncounted,
                                  {sender_end.get(), nullptr})
                  .ok());
      REQUIRE(EncodeChunkModelled(dst.data(), next.data(), n, &from_receiver, nullptr, kUncounted,
                                  {receiver_end.get(), nullptr})
                  .ok());
      CHECK(from_sender == from_receiver);
    }
    carried = std::move(sender_end);
    AdvanceHistory(src.data(), dst.data(), n, history.data());
  }
  MESSAGE("from carried models " << with_carried << " bytes, from priors " << without);
  CHECK(with_carried < without);
}

}  // namespace
}  // namespace arc_v3

// Every kernel on every compiled target against its plain C++ reference, byte for byte:
// lengths 0..3N+1 and large, misaligned pointers, sentinels around every output, and
// exhaustive sweeps where the domain is small.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "src/codec/kernels.h"
#include "tests/hwy_doctest.h"

namespace arc_v3 {
namespace {

constexpr uint8_t kSentinel8 = 0xA5;
constexpr uint16_t kSentinel16 = 0xA5A5;
constexpr uint32_t kSentinel32 = 0xA5A5A5A5;
constexpr size_t kGuard = 64;  // elements of sentinel before and after each output

// Lengths: every length up to 3 vectors of the widest target + 1, then some large ones.
std::vector<size_t> TestLengths() {
  std::vector<size_t> lengths;
  const size_t max_lanes = HWY_MAX_BYTES / sizeof(uint16_t);  // widest compiled vector
  for (size_t n = 0; n <= 3 * max_lanes + 1; ++n) lengths.push_back(n);
  for (size_t n : {size_t{1000}, size_t{4095}, size_t{65536}, size_t{100003}}) lengths.push_back(n);
  return lengths;
}

constexpr size_t kMisalignments[] = {0, 1, 3, 7};

// Random XOR patterns of a chosen density, mixing mantissa-only and high-field changes.
void MakePair(size_t n, double density, uint32_t seed, std::vector<uint16_t>* src,
              std::vector<uint16_t>* dst) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  src->resize(n);
  dst->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*src)[i] = static_cast<uint16_t>(rng());
    uint16_t x = 0;
    if (uniform(rng) < density) {
      x = static_cast<uint16_t>(rng());
      if (uniform(rng) < 0.8) x &= kMantissaMask;
      if (x == 0) x = 1;
    }
    (*dst)[i] = (*src)[i] ^ x;
  }
}

template <class T>
void ExpectGuards(const std::vector<T>& buffer, size_t offset, size_t used, T sentinel) {
  for (size_t i = 0; i < offset; ++i) REQUIRE(buffer[i] == sentinel);
  for (size_t i = offset + used; i < buffer.size(); ++i) REQUIRE(buffer[i] == sentinel);
}

TEST_CASE("ClassifyChanges: all 65536 XOR patterns, every target") {
  std::vector<uint16_t> src(65536, 0), dst(65536);
  for (uint32_t x = 0; x < 65536; ++x) dst[x] = static_cast<uint16_t>(x);
  // Also against a nonzero base, so the XOR (not dst) is what gets classified.
  std::vector<uint16_t> src2(65536), dst2(65536);
  for (uint32_t x = 0; x < 65536; ++x) {
    src2[x] = static_cast<uint16_t>(x * 40503u);
    dst2[x] = static_cast<uint16_t>(src2[x] ^ x);
  }
  test::ForEachTarget([&](const char*) {
    const ChangeCounts all = ClassifyChanges(src.data(), dst.data(), src.size());
    CHECK(all.changed == 65535);
    CHECK(all.high == 65536 - 128);  // patterns with a bit in 0xFF80
    const ChangeCounts all2 = ClassifyChanges(src2.data(), dst2.data(), src2.size());
    CHECK(all2.changed == all.changed);
    CHECK(all2.high == all.high);
    // Pattern by pattern: each single element classified like the reference.
    for (uint32_t x = 0; x < 65536; ++x) {
      const ChangeCounts one = ClassifyChanges(&src[x], &dst[x], 1);
      const ChangeCounts expected = ref::ClassifyChanges(&src[x], &dst[x], 1);
      REQUIRE(one.changed == expected.changed);
      REQUIRE(one.high == expected.high);
    }
  });
}

TEST_CASE("ClassifyChanges and CompactChanges match the reference") {
  for (const double density : {0.0, 0.002, 0.05, 0.5, 1.0}) {
    std::vector<uint16_t> src, dst;
    MakePair(200000, density, 7, &src, &dst);
    test::ForEachTarget([&](const char*) {
      for (const size_t n : TestLengths()) {
        for (const size_t mis : kMisalignments) {
          if (mis + n > src.size()) continue;
          const uint16_t* a = src.data() + mis;
          const uint16_t* b = dst.data() + mis;
          const ChangeCounts got = ClassifyChanges(a, b, n);
          const ChangeCounts want = ref::ClassifyChanges(a, b, n);
          REQUIRE(got.changed == want.changed);
          REQUIRE(got.high == want.high);

          std::vector<uint32_t> pos_want(n + 1), pos_got(want.changed + 2 * kGuard, kSentinel32);
          std::vector<uint16_t> xor_want(n + 1), xor_got(want.changed + 2 * kGuard, kSentinel16);
          const size_t count_want = ref::CompactChanges(a, b, n, pos_want.data(), xor_want.data());
          const size_t count_got =
              CompactChanges(a, b, n, pos_got.data() + kGuard, xor_got.data() + kGuard);
          REQUIRE(count_got == count_want);
          REQUIRE(count_want == want.changed);
          REQUIRE(std::memcmp(pos_got.data() + kGuard, pos_want.data(), count_want * 4) == 0);
          REQUIRE(std::memcmp(xor_got.data() + kGuard, xor_want.data(), count_want * 2) == 0);
          ExpectGuards(pos_got, kGuard, count_got, kSentinel32);
          ExpectGuards(xor_got, kGuard, count_got, kSentinel16);
        }
      }
    });
  }
}

TEST_CASE("PackMantissas / UnpackMantissas match the reference and invert each other") {
  std::mt19937 rng(11);
  std::vector<uint16_t> values(70000 + 8);
  for (auto& v : values) v = static_cast<uint16_t>(rng());  // upper bits must be ignored
  test::ForEachTarget([&](const char*) {
    for (const size_t n : TestLengths()) {
      if (n + 8 > values.size()) continue;
      for (const size_t mis : kMisalignments) {
        const uint16_t* in = values.data() + mis;
        const size_t bytes = PackedMantissaBytes(n);
        std::vector<uint8_t> want(bytes + 1), got(bytes + 2 * kGuard + mis, kSentinel8);
        ref::PackMantissas(in, n, want.data());
        PackMantissas(in, n, got.data() + kGuard + mis);
        REQUIRE(std::memcmp(got.data() + kGuard + mis, want.data(), bytes) == 0);
        ExpectGuards(got, kGuard + mis, bytes, kSentinel8);

        std::vector<uint16_t> unpacked(n + 2 * kGuard + mis, kSentinel16);
        UnpackMantissas(got.data() + kGuard + mis, n, unpacked.data() + kGuard + mis);
        for (size_t k = 0; k < n; ++k) {
          REQUIRE(unpacked[kGuard + mis + k] == (in[k] & kMantissaMask));
        }
        ExpectGuards(unpacked, kGuard + mis, n, kSentinel16);
      }
    }
  });
}

TEST_CASE("UnpackMantissas: every 7-bit value in every slot of a group") {
  test::ForEachTarget([&](const char*) {
    for (size_t slot = 0; slot < 8; ++slot) {
      for (uint16_t v = 0; v < 128; ++v) {
        std::vector<uint16_t> values(64, 0x55);
        values[8 + slot] = v;
        std::vector<uint8_t> packed(PackedMantissaBytes(values.size()));
        ref::PackMantissas(values.data(), values.size(), packed.data());
        std::vector<uint16_t> got(values.size());
        UnpackMantissas(packed.data(), values.size(), got.data());
        for (size_t k = 0; k < values.size(); ++k) REQUIRE(got[k] == (values[k] & kMantissaMask));
      }
    }
  });
}

TEST_CASE("ApplyXor matches the reference, out of place and in place") {
  std::vector<uint16_t> src, dst;
  MakePair(100100, 0.3, 5, &src, &dst);
  test::ForEachTarget([&](const char*) {
    for (const size_t n : TestLengths()) {
      if (n + 8 > src.size()) continue;
      for (const size_t mis : kMisalignments) {
        std::vector<uint16_t> want(n + 1);
        ref::ApplyXor(src.data() + mis, dst.data() + mis, n, want.data());
        std::vector<uint16_t> got(n + 2 * kGuard + mis, kSentinel16);
        ApplyXor(src.data() + mis, dst.data() + mis, n, got.data() + kGuard + mis);
        REQUIRE(std::memcmp(got.data() + kGuard + mis, want.data(), n * 2) == 0);
        ExpectGuards(got, kGuard + mis, n, kSentinel16);
        std::vector<uint16_t> in_place(src.begin() + mis, src.begin() + mis + n);
        ApplyXor(in_place.data(), dst.data() + mis, n, in_place.data());
        REQUIRE(std::equal(in_place.begin(), in_place.end(), want.begin()));
      }
    }
  });
}

TEST_CASE("GroupRateSums: every exponent in every lane, and random groups, vs the reference") {
  // Each exponent field (with sign and mantissa bits set or not) in every lane position
  // of a group, the rest of the group at the extremes of the rate: 0 and 2^32.
  std::vector<uint16_t> values;
  for (int e = 0; e < 256; ++e) {
    for (const uint16_t other : {uint16_t{0x0000}, uint16_t{0x7F80}}) {
      for (int lane = 0; lane < 4; ++lane) {
        for (int k = 0; k < 4; ++k) {
          const uint16_t bits =
              static_cast<uint16_t>((e << 7) | ((e & 1) ? 0x8000 : 0) | (e & 0x7F));
          values.push_back(k == lane ? bits : other);
        }
      }
    }
  }
  std::mt19937 rng(9);
  while (values.size() % 4 != 0 || values.size() < 100100)
    values.push_back(static_cast<uint16_t>(rng()));
  // The reference itself against the rate definition: exponent 0 and zeros have rate log
  // 32, or the cap; exponent 134 (2^7) has rate log 0, and 118 rate log 16.
  uint64_t first = 0;
  CHECK(ref::GroupRateSums(values.data(), 1, kMaxRateLog, &first) == kMaxRateLog);
  CHECK(first == (uint64_t{1} << 32) + 3 * (uint64_t{1} << 32));
  CHECK(ref::GroupRateSums(values.data(), 1, 20, &first) == kMaxRateLog);
  CHECK(first == 4 * (uint64_t{1} << 20));
  {
    const uint16_t moderate[4] = {0x4300, 0x4300, 0x3B00, 0xC300};  // exponents 134, 134, 118, 134
    CHECK(ref::GroupRateSums(moderate, 1, 24, &first) == 16);
    CHECK(first == 3 + (uint64_t{1} << 16));
    CHECK(ref::GroupRateSums(moderate, 1, 10, &first) == 16);
    CHECK(first == 3 + (uint64_t{1} << 10));
    CHECK(ref::GroupRateSums(moderate, 0, 10, &first) == 0);  // no groups
  }
  test::ForEachTarget([&](const char*) {
    for (const int cap : {0, 7, 24, kMaxRateLog}) {
      for (const size_t n : TestLengths()) {
        const size_t groups = n / 4;
        for (const size_t mis : kMisalignments) {
          if (4 * groups + mis > values.size()) continue;
          std::vector<uint64_t> want(groups + 1);
          const int want_largest =
              ref::GroupRateSums(values.data() + mis, groups, cap, want.data());
          std::vector<uint64_t> got(groups + 2 * kGuard, 0xA5A5A5A5A5A5A5A5ull);
          const int got_largest =
              GroupRateSums(values.data() + mis, groups, cap, got.data() + kGuard);
          REQUIRE(got_largest == want_largest);
          REQUIRE(std::equal(want.begin(), want.begin() + groups, got.begin() + kGuard));
          ExpectGuards(got, kGuard, groups, uint64_t{0xA5A5A5A5A5A5A5A5ull});
        }
      }
    }
  });
}

// History bytes: every byte value somewhere (ages 0-7 with and without the up bit, and the
// unused bits 4-7 set), mostly zeros as in a real session.
std::vector<uint8_t> MakeHistory(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> history(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (i < 256) {
      history[i] = static_cast<uint8_t>(i * 37);  // a permutation of 0..255
    } else if (rng() % 4 == 0) {
      history[i] = static_cast<uint8_t>(rng());
    }
  }
  return history;
}

TEST_CASE("HistoryRateSums: every exponent and history byte, and random boosts, vs the reference") {
  std::vector<uint16_t> values;
  for (int e = 0; e < 256; ++e) {
    for (int k = 0; k < 4; ++k) {
      values.push_back(static_cast<uint16_t>((e << 7) | (k == 1 ? 0x8000 : 0) | (e & 0x7F)));
    }
  }
  std::mt19937 rng(10);
  while (values.size() < 100100) values.push_back(static_cast<uint16_t>(rng()));
  const std::vector<uint8_t> history = MakeHistory(values.size(), 11);
  // The reference itself against the definition: exponent 0 has rate log 32 (the clamp),
  // a boost cannot raise it; exponent 134 has rate log 0 and takes the boost. A cap of 2
  // clamps both the rate log and the boosted one. A negative boost lowers the rate log,
  // not below 0.
  {
    const int8_t boosts[8] = {0, 3, 2, 1, 1, 1, 1, 1};
    const uint16_t src[4] = {0x0000, 0x4300, 0x4300, 0x4300};  // exponents 0, 134, 134, 134
    const uint8_t ages[4] = {1, 0, 1, 0x92};                   // 0x92: age 2, bit 4 set
    uint64_t sum = 0;
    ref::HistoryRateSums(src, ages, boosts, 1, kMaxRateLog, &sum);
    CHECK(sum == (uint64_t{1} << 32) + 1 + 8 + 4);
    ref::HistoryRateSums(src, ages, boosts, 1, 2, &sum);
    CHECK(sum == 4 + 1 + 4 + 4);
    const int8_t lowering[8] = {0, -3, -kMaxRateLog, -128, 0, 0, 0, 0};
    const uint16_t mixed[4] = {0x3C00, 0x3C00, 0x3C00, 0x4300};  // exponents 120, ..., 134
    const uint8_t mixed_ages[4] = {1, 2, 3, 2};
    ref::HistoryRateSums(mixed, mixed_ages, lowering, 1, kMaxRateLog, &sum);
    CHECK(sum == (uint64_t{1} << 11) + 1 + 1 + 1);
  }
  const int8_t boost_sets[][8] = {{0, 0, 0, 0, 0, 0, 0, 0},
                                  {0, 4, 3, 2, 2, 2, 2, 2},
                                  {0, 15, 15, 15, 15, 15, 15, 15},
                                  {7, 1, 2, 3, 4, 5, 6, 127},
                                  {0, -kMaxRateLog, -kMaxRateLog, 3, 3, 3, 3, 3},
                                  {-128, -1, -7, -20, 1, 2, -33, 9}};
  test::ForEachTarget([&](const char*) {
    for (const int cap : {0, 12, kMaxRateLog}) {
      for (const auto& boosts : boost_sets) {
        for (const size_t n : TestLengths()) {
          const size_t groups = n / 4;
          for (const size_t mis : kMisalignments) {
            if (4 * groups + mis > values.size()) continue;
            std::vector<uint64_t> want(groups + 1);
            ref::HistoryRateSums(values.data() + mis, history.data() + mis, boosts, groups, cap,
                                 want.data());
            std::vector<uint64_t> got(groups + 2 * kGuard, 0xA5A5A5A5A5A5A5A5ull);
            HistoryRateSums(values.data() + mis, history.data() + mis, boosts, groups, cap,
                            got.data() + kGuard);
            REQUIRE(std::equal(want.begin(), want.begin() + groups, got.begin() + kGuard));
            ExpectGuards(got, kGuard, groups, uint64_t{0xA5A5A5A5A5A5A5A5ull});
          }
        }
      }
    }
  });
}

TEST_CASE("RecentPositions: every history byte, sparse and dense, vs the reference") {
  // The reference against the definition: ages 1 and 2 are recent, whatever the other bits.
  {
    const uint8_t bytes[8] = {0, 1, 2, 3, 7, 0x09, 0xF2, 0xF0};
    uint32_t positions[8];
    REQUIRE(ref::RecentPositions(bytes, 8, positions) == 4);
    CHECK(positions[0] == 1);
    CHECK(positions[1] == 2);
    CHECK(positions[2] == 5);
    CHECK(positions[3] == 6);
  }
  std::vector<uint8_t> dense = MakeHistory(70000, 12);  // every byte value, then 1 in 4
  std::vector<uint8_t> sparse(70000, 0);                // a recent one in ~1,000
  std::mt19937 rng(13);
  for (auto& h : sparse) {
    if (rng() % 1000 == 0) h = static_cast<uint8_t>(1 + rng() % 7);
  }
  test::ForEachTarget([&](const char*) {
    for (const auto* history : {&dense, &sparse}) {
      for (const size_t n : TestLengths()) {
        for (const size_t mis : kMisalignments) {
          if (n + mis > history->size()) continue;
          std::vector<uint32_t> want(n + 1);
          const size_t want_count = ref::RecentPositions(history->data() + mis, n, want.data());
          std::vector<uint32_t> got(n + 2 * kGuard, 0xA5A5A5A5u);
          const size_t got_count = RecentPositions(history->data() + mis, n, got.data() + kGuard);
          REQUIRE(got_count == want_count);
          REQUIRE(std::equal(want.begin(), want.begin() + want_count, got.begin() + kGuard));
          ExpectGuards(got, kGuard, want_count, 0xA5A5A5A5u);
        }
      }
    }
  });
}

TEST_CASE("AdvanceHistory: every history byte, changes across zero and NaN, vs the reference") {
  // The reference against the definition, on hand-made cases.
  {
    const uint16_t src[6] = {0x3F80, 0x3F80, 0x8000, 0x0000, 0x3F80, 0x3F80};
    const uint16_t dst[6] = {0x3F81, 0x3F7F, 0x0000, 0x8000, 0x3F80, 0x3F80};
    uint8_t history[6] = {0, 0x0F, 0, 0, 0x0A, 0xF7};
    ref::AdvanceHistory(src, dst, 6, history);
    CHECK(history[0] == (1 | kHistoryUp));  // 1.0 -> next up
    CHECK(history[1] == 1);                 // down
    CHECK(history[2] == (1 | kHistoryUp));  // -0 -> +0 is up
    CHECK(history[3] == 1);                 // +0 -> -0 is down
    CHECK(history[4] == 0x0B);              // age 2 -> 3, direction kept
    CHECK(history[5] == 0xF7);              // age 7 stays, whole byte
  }
  test::ForEachTarget([&](const char*) {
    for (const double density : {0.0, 0.02, 0.5, 1.0}) {
      std::vector<uint16_t> src, dst;
      MakePair(100100, density, static_cast<uint32_t>(density * 1000) + 12, &src, &dst);
      // Sign flips, NaN and infinity patterns among the changes.
      for (size_t i = 0; i + 3 < src.size(); i += 997) {
        dst[i] = src[i] ^ 0x8000;
        src[i + 1] = 0x7FC1;
        dst[i + 2] = 0xFF80;
      }
      const std::vector<uint8_t> history = MakeHistory(src.size(), 13);
      for (const size_t n : TestLengths()) {
        for (const size_t mis : kMisalignments) {
          if (n + mis > src.size()) continue;
          std::vector<uint8_t> want(history.begin() + mis, history.begin() + mis + n);
          ref::AdvanceHistory(src.data() + mis, dst.data() + mis, n, want.data());
          std::vector<uint8_t> got(n + 2 * kGuard, kSentinel8);
          std::copy(history.begin() + mis, history.begin() + mis + n, got.begin() + kGuard);
          AdvanceHistory(src.data() + mis, dst.data() + mis, n, got.data() + kGuard);
          REQUIRE(std::equal(want.begin(), want.end(), got.begin() + kGuard));
          ExpectGuards(got, kGuard, n, kSentinel8);
        }
      }
    }
  });
}

// Session histories for the rANS kernels: half the elements without a recorded change,
// the others any byte (ages 1-7, either direction, and the unused high bits set).
std::vector<uint8_t> RandomHistory(size_t n, std::mt19937* rng) {
  std::vector<uint8_t> history(n);
  for (auto& h : history) h = (*rng)() % 2 ? 0 : static_cast<uint8_t>((*rng)());
  return history;
}

TEST_CASE("DecodeRansChanges: arbitrary states, probabilities and words, vs the reference") {
  // Every byte string is a valid input to the kernel (the chunk decoder checks the end
  // state), so random words exercise every path: renormalisation in any lane, changes of
  // every kind in any lane, and words running out in the middle of a group. With a
  // history, each element's table is its history class's.
  std::mt19937 rng(14);
  const std::vector<uint8_t> history = RandomHistory(100100 + 8, &rng);
  test::ForEachTarget([&](const char*) {
    for (const uint32_t max_prob : {uint32_t{64}, uint32_t{4096}, uint32_t{65535}}) {
      for (const bool with_history : {false, true}) {
        uint32_t probs[kRansTables], splits[kRansTables];
        for (int c = 0; c < kRansTables; ++c) {
          probs[c] = 3 + static_cast<uint32_t>(rng() % (max_prob - 2));  // 3..max_prob
          const uint32_t a = 1 + static_cast<uint32_t>(rng() % (probs[c] - 2));
          const uint32_t b = a + 1 + static_cast<uint32_t>(rng() % (probs[c] - a - 1));
          splits[c] = a | (b << 16);
        }
        // Random bits span every exponent: classes below, inside and above the window.
        const int class_base = static_cast<int>(rng() % 256);
        std::vector<uint16_t> src(100100 + 8);
        for (auto& v : src) v = static_cast<uint16_t>(rng());
        std::vector<uint8_t> words(2 * 40000);
        for (auto& b : words) b = static_cast<uint8_t>(rng());
        for (const size_t n : TestLengths()) {
          for (const size_t mis : kMisalignments) {
            for (const size_t num_words : {size_t{0}, size_t{3}, n / 8, words.size() / 2 - 1}) {
              uint32_t start_states[kRansLanes];
              for (auto& x : start_states) {
                x = kRansLow + static_cast<uint32_t>(rng() % (0u - kRansLow));
              }
              uint32_t want_states[kRansLanes], got_states[kRansLanes];
              std::copy(start_states, start_states + kRansLanes, want_states);
              std::copy(start_states, start_states + kRansLanes, got_states);
              std::vector<uint32_t> want(n + kRansLanes), want_xors(n + kRansLanes);
              std::vector<uint32_t> got(n + kRansLanes + 2 * kGuard, kSentinel32);
              std::vector<uint32_t> got_xors(n + kRansLanes + 2 * kGuard, kSentinel32);
              size_t want_used = 1, got_used = 1;  // the kernels start after word 1
              const uint8_t* h = with_history ? history.data() + mis : nullptr;
              const size_t want_n = ref::DecodeRansChanges(
                  src.data() + mis, n, class_base, probs, splits, want_states, words.data(),
                  num_words + 1, &want_used, want.data(), want_xors.data(), h);
              const size_t got_n = DecodeRansChanges(
                  src.data() + mis, n, class_base, probs, splits, got_states, words.data(),
                  num_words + 1, &got_used, got.data() + kGuard, got_xors.data() + kGuard, h);
              REQUIRE(got_n == want_n);
              if (want_n == kRansWordsExhausted) continue;  // outputs unspecified
              REQUIRE(got_used == want_used);
              REQUIRE(std::equal(want_states, want_states + kRansLanes, got_states));
              const auto used = static_cast<std::ptrdiff_t>(want_n);
              REQUIRE(std::equal(want.begin(), want.begin() + used, got.begin() + kGuard));
              REQUIRE(std::equal(want_xors.begin(), want_xors.begin() + used,
                                 got_xors.begin() + kGuard));
              // Room for n + kRansLanes entries is what the contract asks; nothing beyond.
              for (const auto* buffer : {&got, &got_xors}) {
                for (size_t i = 0; i < kGuard; ++i) REQUIRE((*buffer)[i] == kSentinel32);
                for (size_t i = kGuard + n + kRansLanes; i < buffer->size(); ++i) {
                  REQUIRE((*buffer)[i] == kSentinel32);
                }
              }
            }
          }
        }
      }
    }
  });
}

TEST_CASE("EncodeRansElements: every kind of change, any tables and states, vs the reference") {
  std::mt19937 rng(15);
  const std::vector<uint8_t> history = RandomHistory(100100 + 8, &rng);
  test::ForEachTarget([&](const char*) {
    for (const double density : {0.0, 0.02, 0.3, 1.0}) {
      for (const bool with_history : {false, true}) {
        uint32_t probs[kRansTables], splits[kRansTables];
        for (int c = 0; c < kRansTables; ++c) {
          probs[c] = 3 + static_cast<uint32_t>(rng() % 65533);  // 3..65535
          const uint32_t a = 1 + static_cast<uint32_t>(rng() % (probs[c] - 2));
          const uint32_t b = a + 1 + static_cast<uint32_t>(rng() % (probs[c] - a - 1));
          splits[c] = a | (b << 16);
        }
        const int class_base = static_cast<int>(rng() % 256);
        // Changes of +-1 in key order (across zero and exponents too) and arbitrary ones.
        std::vector<uint16_t> src(100100 + 8), dst(src.size());
        for (size_t i = 0; i < src.size(); ++i) {
          src[i] = static_cast<uint16_t>(rng());
          dst[i] = src[i];
          if (std::uniform_real_distribution<double>(0, 1)(rng) >= density) continue;
          const uint32_t kind = rng() % 4;
          const uint16_t key = MonotoneKey(src[i]);
          dst[i] = kind == 0   ? FromMonotoneKey(static_cast<uint16_t>(key + 1))
                   : kind == 1 ? FromMonotoneKey(static_cast<uint16_t>(key - 1))
                               : static_cast<uint16_t>(src[i] ^ (1 + rng() % 0xFFFF));
        }
        for (const size_t n : TestLengths()) {
          for (const size_t mis : kMisalignments) {
            uint32_t want_states[kRansLanes], got_states[kRansLanes];
            for (size_t l = 0; l < kRansLanes; ++l) {
              want_states[l] = got_states[l] =
                  kRansLow + static_cast<uint32_t>(rng() % (0u - kRansLow));
            }
            std::vector<uint16_t> want(n + kRansLanes);
            std::vector<uint16_t> got(n + kRansLanes + 2 * kGuard, kSentinel16);
            const uint8_t* h = with_history ? history.data() + mis : nullptr;
            const size_t want_n =
                ref::EncodeRansElements(src.data() + mis, dst.data() + mis, n, class_base, probs,
                                        splits, want_states, want.data(), h);
            const size_t got_n =
                EncodeRansElements(src.data() + mis, dst.data() + mis, n, class_base, probs, splits,
                                   got_states, got.data() + kGuard, h);
            REQUIRE(got_n == want_n);
            REQUIRE(std::equal(want_states, want_states + kRansLanes, got_states));
            REQUIRE(std::equal(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(want_n),
                               got.begin() + kGuard));
            ExpectGuards(got, kGuard, want_n, kSentinel16);
          }
        }
      }
    }
  });
}

// Runs last (doctest orders test cases by file and line). Each ForEachTarget loop above
// checked that it ran on every expected target; here: the loops ran at all, together they
// ran on exactly the expected targets (hwy::SupportedTargets() among the compiled ones,
// and those ARC_V3_EXPECT_TARGETS names: tests/run_neon.sh names SVE2, SVE, NEON and
// EMU128 under qemu's max CPU), and those are EMU128 plus at least one SIMD target.
TEST_CASE("every supported and compiled target ran the per-target tests") {
  const std::set<std::string> expected = test::ExpectedTargets();
  std::string want, ran;
  for (const std::string& t : expected) want += " " + t;
  for (const std::string& t : test::ExercisedTargets()) ran += " " + t;
  MESSAGE("expected targets:", want, "; ran:", ran, "; per-target loops: ", test::TargetLoops());
  CHECK(test::TargetLoops() > 0);
  CHECK(test::ExercisedTargets() == expected);
  CHECK(expected.count("EMU128") == 1);
  CHECK(expected.size() >= 2);
}

}  // namespace
}  // namespace arc_v3

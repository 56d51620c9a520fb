// The built-in RL-delta generator reproduces the statistics of real RL deltas
// (those of the real-run corpus of the development setup) and is deterministic.
#include <doctest/doctest.h>

#include <cmath>

#include "bench/delta_stats.h"
#include "bench/generator.h"

namespace arc_v3 {
namespace bench {
namespace {

GeneratedRun MustGenerate(const GeneratorOptions& options) {
  GeneratedRun run;
  const Status status = Generate(options, &run);
  REQUIRE_MESSAGE(status.ok(), status.ToString());
  return run;
}

DeltaStats StatsOf(const GeneratedRun& run) {
  return AnalyzeDataset(DatasetFromSnapshots("generated", run.layout, run.snapshots));
}

TEST_CASE("generator: statistics match real RL deltas in each regime") {
  for (const double density : {0.002, 0.02, 0.10}) {
    GeneratorOptions options;
    options.params = 1'500'000;
    options.target_density = density;
    options.deltas = 3;
    const DeltaStats s = StatsOf(MustGenerate(options));
    INFO("target density " << density);
    CHECK(s.pairs == 3);
    // The calibrated rate holds within a factor ~1.5 over the saved steps.
    CHECK(s.Density() > density / 1.5);
    CHECK(s.Density() < density * 1.5);
    // Class mix: ~98.5% mantissa-only, ~1.2-1.6% exponent, a few 1e-4 sign flips.
    CHECK(s.OfChanged(s.mantissa_only) > 0.965);
    CHECK(s.OfChanged(s.mantissa_only) < 0.995);
    CHECK(s.OfChanged(s.exponent) > 0.005);
    CHECK(s.OfChanged(s.exponent) < 0.03);
    CHECK(s.OfChanged(s.sign) < 0.003);
    // 85-93% of changes are one step in monotone integer order.
    CHECK(s.OfChanged(s.unit_steps) > 0.78);
    CHECK(s.OfChanged(s.unit_steps) < 0.96);
    // P(change) halves per exponent step: the update does not scale with |w|, the ULP does.
    CHECK(s.ExponentSlope() > -1.3);
    CHECK(s.ExponentSlope() < -0.7);
    // Elements that changed last step change again far more often than others.
    CHECK(s.Overlap() > 0.08);
    CHECK(s.Overlap() < 0.45);
    CHECK(s.Overlap() > 3 * s.OverlapUnchanged());
    // The exponent carries information: bound (b) is well below (a), (b2) below (b).
    CHECK(s.bits_b < 0.9 * s.bits_a);
    CHECK(s.bits_b2 <= s.bits_b);
    // Learning the probabilities costs something, but not a multiple of the bound.
    CHECK(s.bits_b2_learned > s.bits_b2);
    CHECK(s.bits_b2_learned < 1.3 * s.bits_b2);
    // The previous step's state carries information too: (c) below (b2) on those pairs.
    REQUIRE(s.pairs_with_history == s.pairs - 1);
    CHECK(s.bits_c < s.bits_b2_with_history);
    CHECK(s.bits_b2_with_history < s.bits_b2);
  }
}

TEST_CASE("delta stats: the learned bound of a tiny pair, by hand") {
  // Two elements of one exponent, one of them one step up. Plug-in: the position costs
  // 2 H(1/2) = 2 bits, the lone d value nothing. Learned (KT): the first flag 1/2, the
  // second (0 + 1/2) / (1 + 1) = 1/4, so 1 + 2 = 3 bits; d over an alphabet of one: 0.
  const uint16_t prev[2] = {0x3F80, 0x3F80};  // 1.0
  const uint16_t next[2] = {0x3F80, 0x3F81};
  StepPair pair;
  pair.tensors.push_back(TensorPair{"t", 1, 2, 2, prev, next});
  const DeltaStats s = AnalyzePair(pair, nullptr);
  CHECK(s.changed == 1);
  CHECK(s.bits_b2 == doctest::Approx(2.0));
  CHECK(s.bits_b2_learned == doctest::Approx(3.0));
}

TEST_CASE("delta stats: bound (c) of a tiny pair, by hand") {
  // Four elements of one exponent. The previous pair moved element 0 up and element 1
  // down; this pair moves element 0 up by 2 and the untouched element 2 up by 1.
  // (b2): 2 changes among 4 (4 bits) + two distinct d values (2 bits) = 6 bits.
  // (c): the state "up" (1 of 1 changed) and "down" (0 of 1) cost nothing, "unchanged" 1
  // of 2 (2 bits); within each state d is certain: 2 bits.
  const uint16_t step0[4] = {0x3F82, 0x3F82, 0x3F82, 0x3F82};
  const uint16_t step1[4] = {0x3F83, 0x3F81, 0x3F82, 0x3F82};
  const uint16_t step2[4] = {0x3F85, 0x3F81, 0x3F83, 0x3F82};
  StepPair first, second;
  first.tensors.push_back(TensorPair{"t", 1, 4, 4, step0, step1});
  second.tensors.push_back(TensorPair{"t", 1, 4, 4, step1, step2});
  const DeltaStats s = AnalyzePair(second, &first);
  CHECK(s.bits_b2 == doctest::Approx(6.0));
  CHECK(s.pairs_with_history == 1);
  CHECK(s.bits_c == doctest::Approx(2.0));
  CHECK(s.bits_b2_with_history == doctest::Approx(6.0));
  // Without a previous pair there is no (c).
  const DeltaStats alone = AnalyzePair(second, nullptr);
  CHECK(alone.pairs_with_history == 0);
  CHECK(alone.bits_c == 0);
  CHECK(alone.bits_b2 == doctest::Approx(6.0));
}

TEST_CASE("generator: deterministic, independent of the thread count") {
  GeneratorOptions options;
  options.params = 200'000;
  options.deltas = 2;
  options.threads = 1;
  const GeneratedRun a = MustGenerate(options);
  options.threads = 3;
  const GeneratedRun b = MustGenerate(options);
  CHECK(a.snapshots == b.snapshots);
  CHECK(a.learning_rate == b.learning_rate);
  options.seed = 2;
  const GeneratedRun c = MustGenerate(options);
  CHECK(a.snapshots != c.snapshots);
  REQUIRE(a.snapshots.size() == 3);
  size_t total = 0;
  for (const TensorLayout& t : a.layout) {
    CHECK(t.offset == total);
    total += t.count();
  }
  CHECK(a.snapshots[0].size() == total);
  CHECK(total > 100'000);
  CHECK(total < 400'000);
}

TEST_CASE("generator: rejects nonsensical options") {
  GeneratedRun run;
  GeneratorOptions options;
  options.params = 10;
  CHECK(Generate(options, &run).code() == ErrorCode::kInvalidArgument);
  options = GeneratorOptions();
  options.target_density = 0;
  CHECK(Generate(options, &run).code() == ErrorCode::kInvalidArgument);
  options.target_density = 0.7;
  CHECK(Generate(options, &run).code() == ErrorCode::kInvalidArgument);
  options = GeneratorOptions();
  options.deltas = 0;
  CHECK(Generate(options, &run).code() == ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace bench
}  // namespace arc_v3

// Statistics of BF16 step pairs and plug-in entropy bounds, with the definitions the
// real-run corpus's statistics use (so the numbers can be checked against them):
//   d = MonotoneKey(next) - MonotoneKey(prev) for changed elements;
//   (a)  positions i.i.d. per tensor (n H(p)) + H(d | changed) per tensor;
//   (b)  change probability conditioned on the previous value's exponent, per tensor,
//        + H(d | changed) per tensor;
//   (b2) as (b), with d also conditioned on the exponent (exponent buckets pooled over the
//        tensors of a step pair).
//   (c)  for pairs with a previous pair: positions by (exponent, the element's previous-
//        step state: unchanged, up or down) per tensor + H(d | previous-step state) per
//        tensor, what a session's history can use (stats.py's bound (c));
//   (b2 learned) the contexts of (b2), with probabilities learned as the data goes
//        (Krichevsky-Trofimov estimators: positions per tensor and exponent, d per exponent
//        over the pair's distinct d values, that alphabet given for free).
// Plug-in entropies without model cost: achievable only up to that cost, which (b2 learned)
// shows: on 1 M-parameter tensors at 0.2% density it is 14% above (b2).
#ifndef ARC_V3_BENCH_DELTA_STATS_H_
#define ARC_V3_BENCH_DELTA_STATS_H_

#include <cstdint>

#include "bench/dataset.h"

namespace arc_v3 {
namespace bench {

struct DeltaStats {
  uint64_t pairs = 0;
  uint64_t elements = 0, changed = 0;
  // Classes of the changed elements: mantissa only; exponent changed, same sign; sign flipped.
  uint64_t mantissa_only = 0, exponent = 0, sign = 0;
  uint64_t unit_steps = 0;  // |d| == 1
  // Elements and changes by the previous value's exponent field.
  uint64_t by_exponent_total[256] = {}, by_exponent_changed[256] = {};
  // Persistence, over pairs that have a previous pair.
  uint64_t prev_changed = 0, prev_changed_now_changed = 0;
  uint64_t prev_unchanged = 0, prev_unchanged_now_changed = 0;
  // Bounds, in bits.
  double bits_a = 0, bits_b = 0, bits_b2 = 0, bits_b2_learned = 0;
  // Bound (c), over the pairs that have a previous pair (0 without), and (b2) over the same.
  uint64_t pairs_with_history = 0;
  double bits_c = 0, bits_b2_with_history = 0;

  void Add(const DeltaStats& other);
  double Density() const { return elements ? static_cast<double>(changed) / elements : 0; }
  // Share of `count` among the changed elements.
  double OfChanged(uint64_t count) const {
    return changed ? static_cast<double>(count) / changed : 0;
  }
  // P(changed | changed in the previous pair); NaN without a previous pair.
  double Overlap() const;
  double OverlapUnchanged() const;  // P(changed | unchanged in the previous pair)
  // Weighted least-squares slope of log2 P(change) against the exponent (stats.py's fit:
  // bins holding >= 1e-4 of the weights, nonzero rate, weights = bin sizes).
  double ExponentSlope() const;
  // A bound as % of the BF16 bytes.
  double BitsToPercent(double bits) const {
    return elements ? 100.0 * bits / (16.0 * elements) : 0;
  }
};

// Statistics of one step pair. `previous` (may be null) is the pair before it, over the
// same tensors, for the persistence figures.
DeltaStats AnalyzePair(const StepPair& pair, const StepPair* previous);

// All pairs of a dataset pooled; `per_pair`, if not null, receives each pair's statistics.
DeltaStats AnalyzeDataset(const Dataset& dataset, std::vector<DeltaStats>* per_pair = nullptr);

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_DELTA_STATS_H_

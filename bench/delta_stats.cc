#include "bench/delta_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "bench/bf16.h"

namespace arc_v3 {
namespace bench {
namespace {

// n H(c / n) in bits: the cost of c i.i.d. positions among n.
double PositionBits(double n, double c) {
  if (c <= 0 || c >= n) return 0;
  const double p = c / n;
  return -n * (p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

// Sequential code length (bits) of a sample of n symbols over an alphabet of k, given its
// symbol counts, when each symbol is coded with the Krichevsky-Trofimov estimator
// (count + 1/2) / (seen + k/2): the cost of learning the probabilities on the way.
class LearnedBits {
 public:
  explicit LearnedBits(double alphabet) : alphabet_(alphabet) {}
  void Add(double count) {
    if (count <= 0) return;
    total_ += count;
    log_numerator_ += std::lgamma(count + 0.5) - std::lgamma(0.5);
  }
  double Bits() const {
    const double log_p =
        log_numerator_ + std::lgamma(alphabet_ / 2) - std::lgamma(total_ + alphabet_ / 2);
    return total_ > 0 ? -log_p / std::log(2.0) : 0;
  }

 private:
  double alphabet_, total_ = 0, log_numerator_ = 0;
};

// Learned code length of c changed positions among n (a binary alphabet).
double LearnedPositionBits(double n, double c) {
  LearnedBits bits(2);
  bits.Add(c);
  bits.Add(n - c);
  return bits.Bits();
}

// Plug-in code length (bits) of a sample given its symbol counts: t log2 t - sum c log2 c.
class CountBits {
 public:
  void Add(double count) {
    if (count <= 0) return;
    total_ += count;
    sum_ += count * std::log2(count);
  }
  double Bits() const { return total_ > 0 ? total_ * std::log2(total_) - sum_ : 0; }

 private:
  double total_ = 0, sum_ = 0;
};

// Plug-in code length of a sample of symbols (sorted in place).
template <class T>
double SampleBits(std::vector<T>* symbols) {
  std::sort(symbols->begin(), symbols->end());
  CountBits bits;
  for (size_t i = 0; i < symbols->size();) {
    size_t j = i;
    while (j < symbols->size() && (*symbols)[j] == (*symbols)[i]) ++j;
    bits.Add(static_cast<double>(j - i));
    i = j;
  }
  return bits.Bits();
}

}  // namespace

void DeltaStats::Add(const DeltaStats& o) {
  pairs += o.pairs;
  elements += o.elements;
  changed += o.changed;
  mantissa_only += o.mantissa_only;
  exponent += o.exponent;
  sign += o.sign;
  unit_steps += o.unit_steps;
  for (int e = 0; e < 256; ++e) {
    by_exponent_total[e] += o.by_exponent_total[e];
    by_exponent_changed[e] += o.by_exponent_changed[e];
  }
  prev_changed += o.prev_changed;
  prev_changed_now_changed += o.prev_changed_now_changed;
  prev_unchanged += o.prev_unchanged;
  prev_unchanged_now_changed += o.prev_unchanged_now_changed;
  bits_a += o.bits_a;
  bits_b += o.bits_b;
  bits_b2 += o.bits_b2;
  bits_b2_learned += o.bits_b2_learned;
  pairs_with_history += o.pairs_with_history;
  bits_c += o.bits_c;
  bits_b2_with_history += o.bits_b2_with_history;
}

double DeltaStats::Overlap() const {
  return prev_changed ? static_cast<double>(prev_changed_now_changed) / prev_changed
                      : std::numeric_limits<double>::quiet_NaN();
}

double DeltaStats::OverlapUnchanged() const {
  return prev_unchanged ? static_cast<double>(prev_unchanged_now_changed) / prev_unchanged
                        : std::numeric_limits<double>::quiet_NaN();
}

double DeltaStats::ExponentSlope() const {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int e = 1; e < 256; ++e) {
    const double n = static_cast<double>(by_exponent_total[e]);
    if (n < std::max(1.0, 1e-4 * elements) || by_exponent_changed[e] == 0) continue;
    const double y = std::log2(by_exponent_changed[e] / n);
    sw += n;
    sx += n * e;
    sy += n * y;
    sxx += n * e * e;
    sxy += n * e * y;
  }
  const double denominator = sw * sxx - sx * sx;
  return denominator > 0 ? (sw * sxy - sx * sy) / denominator
                         : std::numeric_limits<double>::quiet_NaN();
}

DeltaStats AnalyzePair(const StepPair& pair, const StepPair* previous) {
  DeltaStats stats;
  stats.pairs = 1;
  // (exponent, d) of every change in the pair, for H(d | exponent).
  std::vector<uint64_t> exponent_and_d;
  double b2_position_bits = 0, learned_position_bits = 0;
  bool with_history = previous != nullptr;  // every tensor has its previous step: (c)
  for (size_t ti = 0; ti < pair.tensors.size(); ++ti) {
    const TensorPair& t = pair.tensors[ti];
    const TensorPair* before = nullptr;
    if (previous != nullptr && ti < previous->tensors.size() &&
        previous->tensors[ti].name == t.name && previous->tensors[ti].count == t.count) {
      before = &previous->tensors[ti];
    }
    uint64_t total[256] = {}, changed[256] = {};
    // (c): by exponent and the element's previous-step state (0 unchanged, 1 up, 2 down).
    uint64_t state_total[256 * 3] = {}, state_changed[256 * 3] = {}, changed_in_state[3] = {};
    std::vector<uint64_t> state_and_d;
    std::vector<int32_t> d_values;
    for (size_t i = 0; i < t.count; ++i) {
      const uint16_t a = t.prev[i], b = t.next[i];
      const int e = ExponentField(a);
      ++total[e];
      const bool was_changed = before != nullptr && before->prev[i] != before->next[i];
      int state = 0;
      if (before != nullptr) {
        ++(was_changed ? stats.prev_changed : stats.prev_unchanged);
        if (was_changed)
          state = MonotoneKey(before->next[i]) > MonotoneKey(before->prev[i]) ? 1 : 2;
        ++state_total[3 * e + state];
      }
      if (a == b) continue;
      ++changed[e];
      if (before != nullptr)
        ++(was_changed ? stats.prev_changed_now_changed : stats.prev_unchanged_now_changed);
      const uint16_t x = a ^ b;
      if (x & 0x8000) {
        ++stats.sign;
      } else if (x & 0x7F80) {
        ++stats.exponent;
      } else {
        ++stats.mantissa_only;
      }
      const int32_t d = MonotoneKey(b) - MonotoneKey(a);
      stats.unit_steps += (d == 1 || d == -1);
      d_values.push_back(d);
      if (before != nullptr) {
        ++state_changed[3 * e + state];
        ++changed_in_state[state];
        state_and_d.push_back((static_cast<uint64_t>(state) << 20) |
                              static_cast<uint64_t>(d + (1 << 17)));
      }
      exponent_and_d.push_back((static_cast<uint64_t>(e) << 20) |
                               static_cast<uint64_t>(d + (1 << 17)));
    }
    const double c = static_cast<double>(d_values.size());
    const double d_bits = SampleBits(&d_values);
    double exponent_position_bits = 0;
    for (int e = 0; e < 256; ++e) {
      exponent_position_bits +=
          PositionBits(static_cast<double>(total[e]), static_cast<double>(changed[e]));
      if (total[e] > 0) {
        learned_position_bits +=
            LearnedPositionBits(static_cast<double>(total[e]), static_cast<double>(changed[e]));
      }
      stats.by_exponent_total[e] += total[e];
      stats.by_exponent_changed[e] += changed[e];
    }
    stats.elements += t.count;
    stats.changed += d_values.size();
    stats.bits_a += PositionBits(static_cast<double>(t.count), c) + d_bits;
    stats.bits_b += exponent_position_bits + d_bits;
    b2_position_bits += exponent_position_bits;
    if (before != nullptr) {
      // Positions per (exponent, state) + H(d | state), all within the tensor.
      double bits = 0;
      for (size_t k = 0; k < 256 * 3; ++k) {
        bits += PositionBits(static_cast<double>(state_total[k]),
                             static_cast<double>(state_changed[k]));
      }
      CountBits state_bits;
      for (const uint64_t count : changed_in_state) state_bits.Add(static_cast<double>(count));
      stats.bits_c += bits + SampleBits(&state_and_d) - state_bits.Bits();
    } else {
      with_history = false;
    }
  }
  // H(d | exponent) over the pair = H(exponent, d) - H(exponent), in total bits.
  CountBits exponent_bits;
  for (int e = 0; e < 256; ++e)
    exponent_bits.Add(static_cast<double>(stats.by_exponent_changed[e]));
  stats.bits_b2 = b2_position_bits + SampleBits(&exponent_and_d) - exponent_bits.Bits();  // sorts
  if (with_history) {
    stats.pairs_with_history = 1;
    stats.bits_b2_with_history = stats.bits_b2;
  } else {
    stats.bits_c = 0;
  }

  // The same, learned: d per exponent, over the alphabet of the pair's distinct d values.
  std::vector<uint64_t> distinct_d;
  for (const uint64_t key : exponent_and_d) distinct_d.push_back(key & ((uint64_t{1} << 20) - 1));
  std::sort(distinct_d.begin(), distinct_d.end());
  const double alphabet =
      static_cast<double>(std::unique(distinct_d.begin(), distinct_d.end()) - distinct_d.begin());
  double learned_value_bits = 0;
  for (size_t i = 0; i < exponent_and_d.size();) {  // runs of one exponent, then of one d
    LearnedBits bits(alphabet);
    const uint64_t exponent = exponent_and_d[i] >> 20;
    while (i < exponent_and_d.size() && exponent_and_d[i] >> 20 == exponent) {
      size_t j = i;
      while (j < exponent_and_d.size() && exponent_and_d[j] == exponent_and_d[i]) ++j;
      bits.Add(static_cast<double>(j - i));
      i = j;
    }
    learned_value_bits += bits.Bits();
  }
  stats.bits_b2_learned = learned_position_bits + learned_value_bits;
  return stats;
}

DeltaStats AnalyzeDataset(const Dataset& dataset, std::vector<DeltaStats>* per_pair) {
  DeltaStats total;
  if (per_pair != nullptr) per_pair->clear();
  for (size_t p = 0; p < dataset.pairs.size(); ++p) {
    const DeltaStats pair = AnalyzePair(dataset.pairs[p], p > 0 ? &dataset.pairs[p - 1] : nullptr);
    total.Add(pair);
    if (per_pair != nullptr) per_pair->push_back(pair);
  }
  return total;
}

}  // namespace bench
}  // namespace arc_v3

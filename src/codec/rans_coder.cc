// rANS chunk coder (see rans_coder.h; the bytes are specified in src/codec/FORMAT.md, "rANS
// chunk").
//
// Chunk bytes (after the frame's Chunk_Mode byte):
//   Class_Base    1 byte   e0: element i is in class clamp(exponent(src[i]) - e0, 0, 15)
//   Change_Q      16 bytes P(change | class c) = ProbOfQ(Change_Q[c]) = 2^16 * 2^(-q/16)
//   Value_Log     2 x u16  V0, V1 and
//   Value_Slope   2 bytes  S0, S1: the chance that |d| >= 2^(j+1) given |d| >= 2^j is
//                          x / (1 + x), x = 2^((V - S (exponent + j)) / 16), with V0, S0 for
//                          j = 0 (the escape share) and V1, S1 for j >= 1 (the escapes'
//                          classes)
//   Element_Words varint   number of 16-bit words of the element stream
//   Element stream         16 x u32 states, then the words (DecodeRansChanges): one symbol
//                          per element, unchanged / +1 / -1 / escape (|d| >= 2)
//   Escape words           the rest of the chunk: the escape stream (2 states, then words:
//                          the log2 class, low bits and sign of each escape) goes on from
//                          the 16 units the element states end on
// Both streams are rANS with 16-bit probabilities, states in [2^16, 2^32) and 16-bit
// renormalisation. The element encoder starts state l at 2^16 + unit l of the escape
// stream, so the decoder gets those 16 units back from where its states end (they would
// be 32 bytes of padding otherwise); the escape encoder starts at 2^16.
// Most changes are +-1: the vectorised element stream decodes them completely.
#include "src/codec/rans_coder.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "src/codec/format.h"
#include "src/codec/kernels.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace {

constexpr int kClasses = kRansClasses;
constexpr int kEscapeLanes = 2;
constexpr int kUnaryDecisions = 15;             // |d| <= 2^15: log2 class 0..15
constexpr int kEscapeClasses = 15;              // an escape's log2 class: 1..15
constexpr int kValueZ = 256 + kUnaryDecisions;  // z = exponent + j
constexpr uint32_t kProbScale = 1u << 16;
constexpr size_t kHeaderBytes = 1 + kClasses + 4 + 2;
// With a history: History_Change_Q and History_Up_Q, kClasses bytes per history class 1, 2.
constexpr size_t kHistoryHeaderBytes = kHeaderBytes + 4 * kClasses;
constexpr size_t kElementStateBytes = 4 * kRansLanes;
constexpr size_t kEscapeStateBytes = 4 * kEscapeLanes;
// Units of the escape stream carried by the element states' ends.
constexpr size_t kLaneUnits = kRansLanes;
constexpr uint8_t kOctaveSlope = 16;  // one octave per exponent step
// The slopes the encoder tries (the decoder takes any byte).
constexpr int kMinSlope = 2;
constexpr int kMaxSlope = 64;

// 256 * RansHistoryClass(b) for every history byte b: the encoder's tallies.
struct HistoryOffsets {
  uint16_t of[256];
};
constexpr HistoryOffsets MakeHistoryOffsets() {
  HistoryOffsets offsets{};
  for (int b = 0; b < 256; ++b) {
    offsets.of[b] = static_cast<uint16_t>(256 * RansHistoryClass(static_cast<uint8_t>(b)));
  }
  return offsets;
}
constexpr HistoryOffsets kHistoryOffsets = MakeHistoryOffsets();

// 2^(t/16) in units of 2^-16, for |t| <= 16 * 24 (rounded; 0 only far below 1).
inline uint64_t Pow2Sixteenths(int t) {
  static constexpr uint64_t kPow2[16] = {65536,  68438,  71468,  74632, 77936,  81386,
                                         84990,  88752,  92682,  96785, 101070, 105545,
                                         110218, 115098, 120194, 125515};
  const int octave = t >> 4;  // floor
  const uint64_t base = kPow2[t & 15];
  if (octave >= 0) return base << octave;
  return (base + (uint64_t{1} << (-octave - 1))) >> -octave;
}

inline uint32_t ClampRansProb(uint64_t p) {
  return static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(p, 1), kProbScale - 1));
}

// P(change) of a Change_Q byte: 2^(-q/16), q = 0 meaning "almost surely".
inline uint32_t ProbOfQ(int q) { return ClampRansProb(Pow2Sixteenths(-q)); }

// P = x / (1 + x) with x = 2^(t/16), t clamped to +-256 (P within 2^-16 of 0 or 1).
inline uint32_t ProbOfLog(int t) {
  const uint64_t x = Pow2Sixteenths(std::min(std::max(t, -256), 256));
  return ClampRansProb((x << 16) / (x + kProbScale));
}

// The decoder's view of a chunk's model.
struct RansModel {
  // Element symbols by class (DecodeRansChanges): P(change) = p (at least 3, so that
  // each of the three change symbols has a frequency), split into an escape [0, a), +1
  // [a, b) and -1 [b, p); a / p follows P(|d| >= 2) at the class's exponent
  // class_base + c, and the signs share the rest evenly. With a session history
  // (`history_q` not null: the Change_Q, then the Up_Q bytes of history classes 1 and 2,
  // kClasses each) tables kClasses..kRansTables - 1 hold the classes of elements whose
  // last change went up or down; their +1 share of the rest is (2 Up_Q + 1) / 512.
  int class_base;
  uint32_t change[kRansTables];
  uint32_t splits[kRansTables];  // a | b << 16
  // Escapes: the log2 class j = 1..15 of |d| as one symbol, per class: j's interval of
  // [0, 2^16) is [escape_start[c][j], escape_start[c][j + 1]).
  uint32_t escape_start[kClasses][kEscapeClasses + 2];

  RansModel(int base, const uint8_t* change_q, const uint16_t* value_log,
            const uint8_t* value_slope, const uint8_t* history_q = nullptr)
      : class_base(base) {
    const int tables = history_q != nullptr ? kRansTables : kClasses;
    for (int t = 0; t < tables; ++t) {
      const int c = t % kClasses, h = t / kClasses;
      const uint8_t q = h == 0 ? change_q[c] : history_q[(h - 1) * kClasses + c];
      const uint32_t p = std::max<uint32_t>(ProbOfQ(q), 3);
      const uint32_t escape =
          (p * ProbOfLog(value_log[0] - value_slope[0] * (base + c)) + 32768) >> 16;
      const uint32_t a = std::min(std::max<uint32_t>(escape, 1), p - 2);
      uint32_t up = (p - a + 1) / 2;
      if (h > 0) {
        const uint32_t up_q = history_q[2 * kClasses + (h - 1) * kClasses + c];
        up = std::min(std::max(((p - a) * (2 * up_q + 1) + 256) >> 9, 1u), p - a - 1);
      }
      change[t] = p;
      splits[t] = a | ((a + up) << 16);
    }
    for (int c = 0; c < kClasses; ++c) {
      EscapeIntervals(value_log[1], value_slope[1], base + c, escape_start[c]);
    }
  }

  int ClassOf(uint16_t bits) const {
    return std::min(std::max(ExponentOf(bits) - class_base, 0), kClasses - 1);
  }

  // P(j) = (q_1 ... q_(j-1)) (1 - q_j) with q_k = P(|d| >= 2^(k+1) | >= 2^k) =
  // ProbOfLog(V1 - S1 (e + k)) (q_15 = 0), in units of 2^-32, then frequencies of 2^16:
  // each at least 1, the rounding remainder to the most likely class.
  static void EscapeIntervals(int v1, int s1, int e, uint32_t* start) {
    uint32_t freq[kEscapeClasses + 1] = {};
    uint64_t reach = uint64_t{1} << 32;  // P(j >= k)
    int64_t total = 0;
    int most = 1;
    for (int k = 1; k <= kEscapeClasses; ++k) {
      const uint64_t next = k < kEscapeClasses ? (reach * ProbOfLog(v1 - s1 * (e + k))) >> 16 : 0;
      freq[k] = std::max<uint32_t>(static_cast<uint32_t>((reach - next) >> 16), 1);
      total += freq[k];
      if (freq[k] > freq[most]) most = k;
      reach = next;
    }
    freq[most] = static_cast<uint32_t>(freq[most] + (int64_t{kProbScale} - total));
    start[0] = start[1] = 0;
    for (int k = 1; k <= kEscapeClasses; ++k) start[k + 1] = start[k] + freq[k];
  }
};

// ---------------------------------------------------------------------------------------
// Costs for the encoder's choices, in 2^-16 bits, integer only (so every machine makes
// the same choices and writes the same bytes).

// Log2Q16 (src/codec/kernels.h) gives the logarithms.

// -log2(p / 2^16) in Q16 for p in [1, 2^16), from a table built on first use.
uint32_t CostOf(uint32_t p) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> costs(kProbScale);
    costs[0] = 16u << 16;
    for (uint32_t q = 1; q < kProbScale; ++q) costs[q] = (16u << 16) - Log2Q16(q);
    return costs;
  }();
  return table[p];
}

// Cost of k events among n trials at probability p.
inline uint64_t BinaryCost(uint64_t n, uint64_t k, uint32_t p) {
  return k * CostOf(p) + (n - k) * CostOf(kProbScale - p);
}

// The Change_Q byte that codes k changes among n elements most cheaply, and its cost.
uint8_t BestChangeQ(uint64_t n, uint64_t k, uint64_t* cost) {
  if (k == 0 || k == n) {
    const uint8_t q = k == 0 ? 255 : 0;
    *cost = BinaryCost(n, k, ProbOfQ(q));
    return q;
  }
  // q ~ 16 log2(n / k), then the neighbours (rounding of the Q16 logs and of ProbOfQ).
  const int guess =
      std::min(static_cast<int>(((uint64_t{Log2Q16(n)} - Log2Q16(k)) * 16 + 32768) >> 16), 255);
  uint8_t best = 0;
  *cost = std::numeric_limits<uint64_t>::max();
  for (int q = std::max(guess - 1, 0); q <= std::min(guess + 1, 255); ++q) {
    const uint64_t c = BinaryCost(n, k, ProbOfQ(q));
    if (c < *cost) {
      *cost = c;
      best = static_cast<uint8_t>(q);
    }
  }
  return best;
}

// Class_Base and Change_Q from the chunk's element and change counts per exponent, for
// each of `histories` history classes (1 without a session history; change_q gets
// kClasses bytes per history class). With a span of at most 16 exponents every one gets
// its own class; otherwise every window of 16 is tried (the ends of the window absorb
// the exponents beyond it).
// Returns the cost of the chosen model's change decisions, in 2^-16 bits.
uint64_t ChoosePositionModel(const uint64_t (*all)[256], const uint64_t (*changed)[256],
                             int histories, uint8_t* class_base, uint8_t* change_q) {
  int lo = 255, hi = 0;
  for (int h = 0; h < histories; ++h) {
    for (int e = 0; e < 256; ++e) {
      if (all[h][e] != 0) {
        lo = std::min(lo, e);
        hi = std::max(hi, e);
      }
    }
  }
  uint64_t best_cost = std::numeric_limits<uint64_t>::max();
  for (int base = lo; base <= std::max(lo, hi - (kClasses - 1)); ++base) {
    uint64_t cost = 0;
    uint8_t q[kRansTables];
    for (int h = 0; h < histories; ++h) {
      uint64_t n[kClasses] = {}, k[kClasses] = {};
      for (int e = lo; e <= hi; ++e) {
        const int c = std::min(std::max(e - base, 0), kClasses - 1);
        n[c] += all[h][e];
        k[c] += changed[h][e];
      }
      for (int c = 0; c < kClasses; ++c) {
        uint64_t class_cost = 0;
        q[h * kClasses + c] = n[c] == 0 ? 255 : BestChangeQ(n[c], k[c], &class_cost);
        cost += class_cost;
      }
    }
    if (cost < best_cost) {
      best_cost = cost;
      *class_base = static_cast<uint8_t>(base);
      std::memcpy(change_q, q, static_cast<size_t>(histories) * kClasses);
    }
  }
  return best_cost;
}

// The Up_Q byte that codes `ups` +1 and `downs` -1 steps most cheaply: the +1 share
// (2 Up_Q + 1) / 512 of the step symbols' interval. Adds its cost to *total.
uint8_t BestUpQ(uint64_t ups, uint64_t downs, uint64_t* total) {
  uint8_t best = 128;
  uint64_t best_cost = std::numeric_limits<uint64_t>::max();
  for (uint32_t u = 0; u < 256; ++u) {
    const uint32_t share = (2 * u + 1) << 7;  // in units of 2^-16
    const uint64_t cost = ups * CostOf(share) + downs * CostOf(kProbScale - share);
    if (cost < best_cost) {
      best_cost = cost;
      best = static_cast<uint8_t>(u);
    }
  }
  *total += best_cost;
  return best;
}

// The costs of an event and of its absence at probability ProbOfLog(t), t in [-256, 256]
// (ProbOfLog clamps beyond).
struct LogisticCosts {
  uint32_t event[513];
  uint32_t no_event[513];
};
const LogisticCosts& Logistic() {
  static const LogisticCosts table = [] {
    LogisticCosts costs;
    for (int t = -256; t <= 256; ++t) {
      const uint32_t p = ProbOfLog(t);
      costs.event[t + 256] = CostOf(p);
      costs.no_event[t + 256] = CostOf(kProbScale - p);
    }
    return costs;
  }();
  return table;
}

// The value curve (V, S) that codes the tallied decisions (ones[z], zeros[z]) most
// cheaply. The cost is convex in (V, S) (a logistic regression, t = V - S z), and nearly
// separable written as t = W - S (z - center) about the decisions' mean z: a scan of W
// at S = 16 (one octave per exponent step), then a pattern search on (W, S) with halving
// steps. Real runs lie between 1 and 2 octaves per exponent step, so a fixed slope would
// cost payload (docs/format_notes.md).
struct ValueCurve {
  uint16_t log;
  uint8_t slope;
};
ValueCurve ChooseValueCurve(const uint64_t* ones, const uint64_t* zeros) {
  int zs[kValueZ];
  uint64_t events[kValueZ], non_events[kValueZ];
  int active = 0;
  uint64_t weight = 0, weighted_z = 0;
  for (int z = 0; z < kValueZ; ++z) {
    if (ones[z] + zeros[z] == 0) continue;
    zs[active] = z;
    events[active] = ones[z];
    non_events[active] = zeros[z];
    ++active;
    weight += ones[z] + zeros[z];
    weighted_z += (ones[z] + zeros[z]) * static_cast<uint64_t>(z);
  }
  if (active == 0) return {0, kOctaveSlope};  // no such decisions in this chunk
  const int center = static_cast<int>(weighted_z / weight);
  const LogisticCosts& costs = Logistic();
  const uint64_t kInvalid = std::numeric_limits<uint64_t>::max();
  const auto cost_of = [&](int w, int slope) {
    const int v = w + slope * center;
    if (slope < kMinSlope || slope > kMaxSlope || v < 0 || v > 0xFFFF) return kInvalid;
    uint64_t cost = 0;
    for (int i = 0; i < active; ++i) {
      const int t = std::min(std::max(v - slope * zs[i], -256), 256) + 256;
      cost += events[i] * costs.event[t] + non_events[i] * costs.no_event[t];
    }
    return cost;
  };
  int best_w = 0, best_slope = kOctaveSlope;
  uint64_t best_cost = kInvalid;
  for (int w = -256; w <= 256; w += 16) {
    const uint64_t c = cost_of(w, kOctaveSlope);
    if (c < best_cost) best_cost = c, best_w = w;
  }
  int step_w = 8, step_slope = 4;
  for (;;) {
    const int moves[4][2] = {{step_w, 0}, {-step_w, 0}, {0, step_slope}, {0, -step_slope}};
    int move = -1;
    uint64_t move_cost = best_cost;
    for (int m = 0; m < 4; ++m) {
      const uint64_t c = cost_of(best_w + moves[m][0], best_slope + moves[m][1]);
      if (c < move_cost) move_cost = c, move = m;
    }
    if (move >= 0) {
      best_w += moves[move][0];
      best_slope += moves[move][1];
      best_cost = move_cost;
    } else if (step_w > 1 || step_slope > 1) {
      step_w = std::max(step_w / 2, 1);
      step_slope = std::max(step_slope / 2, 1);
    } else {
      break;
    }
  }
  return {static_cast<uint16_t>(best_w + best_slope * center), static_cast<uint8_t>(best_slope)};
}

// Elements by history class (0 without a history) and exponent. Four histograms, so that
// equal exponents in a row do not wait for each other. A template parameter: the loop
// without a history must not test for one per element.
template <bool kWithHistory>
void TallyElements(const uint16_t* src, size_t len, const uint8_t* history, uint64_t (*all)[256]) {
  uint32_t partial[4][kRansHistoryClasses * 256] = {};
  // Each element's histogram offset: 256 * its history class.
  const auto offset = [&](size_t i) -> int {
    return kWithHistory ? kHistoryOffsets.of[history[i]] : 0;
  };
  size_t i = 0;
  for (; i + 4 <= len; i += 4) {
    ++partial[0][offset(i) + ExponentOf(src[i])];
    ++partial[1][offset(i + 1) + ExponentOf(src[i + 1])];
    ++partial[2][offset(i + 2) + ExponentOf(src[i + 2])];
    ++partial[3][offset(i + 3) + ExponentOf(src[i + 3])];
  }
  for (; i < len; ++i) ++partial[0][offset(i) + ExponentOf(src[i])];
  for (int h = 0; h < kRansHistoryClasses; ++h) {
    for (int e = 0; e < 256; ++e) {
      const int at = 256 * h + e;
      all[h][e] = uint64_t{partial[0][at]} + partial[1][at] + partial[2][at] + partial[3][at];
    }
  }
}

// ---------------------------------------------------------------------------------------
// rANS encoding: symbols are coded last to first; the words come out in reverse.
// x / freq by a 64-bit reciprocal: with rcp = floor(2^64 / freq) + 1, floor(x * rcp / 2^64)
// = floor(x / freq) for every x < 2^32 (the error, below 2^-32, never reaches the next
// integer, which is at least 1 / freq >= 2^-16 away). freq = 1 divides trivially.
struct EncSymbol {
  uint32_t start;
  uint32_t freq;
  uint64_t rcp;
};
inline EncSymbol MakeSymbol(uint32_t start, uint32_t freq) {
  return {start, freq, freq == 1 ? 0 : ~uint64_t{0} / freq + 1};
}

class RansEncoder {
 public:
  explicit RansEncoder(std::vector<uint16_t>* words) : words_(words) {}

  inline void Put(uint32_t* x, const EncSymbol& symbol) {
    if (*x >= (symbol.freq << 16)) {
      words_->push_back(static_cast<uint16_t>(*x));
      *x >>= 16;
    }
    const uint32_t q =
        symbol.freq == 1
            ? *x
            : static_cast<uint32_t>((static_cast<unsigned __int128>(*x) * symbol.rcp) >> 64);
    *x = (q << 16) + (*x - q * symbol.freq) + symbol.start;
  }
  // `bits` uniform bits (1..16): a power-of-two frequency divides by shifting.
  inline void PutUniform(uint32_t* x, uint32_t value, int bits) {
    const int shift = 16 - bits;
    if (*x >= (1u << (16 + shift))) {
      words_->push_back(static_cast<uint16_t>(*x));
      *x >>= 16;
    }
    *x = ((*x >> shift) << 16) + (*x & ((1u << shift) - 1)) + (value << shift);
  }

 private:
  std::vector<uint16_t>* words_;
};

// The states, then the words in decoding order (the reverse of their coding order).
void AppendStream(const uint32_t* states, int num_states, const uint16_t* words, size_t num_words,
                  std::vector<uint8_t>* out) {
  for (int s = 0; s < num_states; ++s) PutU32(states[s], out);
  const size_t at = out->size();
  out->resize(at + 2 * num_words);
  uint8_t* bytes = out->data() + at;
  for (size_t w = 0; w < num_words; ++w) {
    const uint16_t word = words[num_words - 1 - w];
    bytes[2 * w] = static_cast<uint8_t>(word);
    bytes[2 * w + 1] = static_cast<uint8_t>(word >> 8);
  }
}

// The change of one element as coded: log2 class, the bits below the top one, the sign.
struct ValueCode {
  int cls;
  uint32_t low_bits;
  bool negative;
};
inline ValueCode ValueCodeOf(uint16_t prev, uint16_t next) {
  const int d = static_cast<int16_t>(static_cast<uint16_t>(MonotoneKey(next) - MonotoneKey(prev)));
  const uint32_t magnitude = static_cast<uint32_t>(d < 0 ? -d : d);
  const int cls = 31 - __builtin_clz(magnitude);
  return {cls, magnitude - (1u << cls), d < 0};
}

// ---------------------------------------------------------------------------------------
// rANS decoding of the escape stream (the element stream is the DecodeRansChanges
// kernel's).
// Inlined into the decoding loop, so that the states stay in registers (GCC does not
// inline Decode on its own: it calls it with the state in memory, which is much slower).
#define ARC_V3_RANS_INLINE inline __attribute__((always_inline))

class EscapeDecoder {
 public:
  EscapeDecoder(const RansModel& model, const uint8_t* words, size_t num_words)
      : model_(model), words_(words), num_words_(num_words) {}

  // The XOR of the escape (|d| >= 2) of `prev` coded on state x. A |d| the encoder cannot
  // write, or a word missing, makes AllRead() false.
  ARC_V3_RANS_INLINE uint16_t Decode(uint32_t& x, uint16_t prev) {
    const uint32_t* start = model_.escape_start[model_.ClassOf(prev)];
    // The class whose interval holds the slot, without branches.
    const uint32_t slot = x & 0xFFFF;
    int cls = 1;
    for (int k = 2; k <= kEscapeClasses; ++k) cls += slot >= start[k];
    x = (start[cls + 1] - start[cls]) * (x >> 16) + slot - start[cls];
    Renormalize(x);
    const uint32_t code = GetUniform(x, cls + 1);
    const uint32_t magnitude = (1u << cls) | (code >> 1);
    const bool negative = code & 1;
    // |d| <= 2^15, and -2^15 has one coding: negative.
    bad_ |= magnitude > 0x8000 || (magnitude == 0x8000 && !negative);
    const uint16_t step = static_cast<uint16_t>(negative ? 0u - magnitude : magnitude);
    return static_cast<uint16_t>(prev ^
                                 FromMonotoneKey(static_cast<uint16_t>(MonotoneKey(prev) + step)));
  }
  // Every word read, none missing.
  bool AllRead() const { return !bad_ && next_ == num_words_; }
  // A word was missing, or a |d| out of range.
  bool Failed() const { return bad_; }
  size_t WordsRead() const { return next_; }

 private:
  ARC_V3_RANS_INLINE uint32_t GetUniform(uint32_t& x, int bits) {
    const uint32_t slot = x & 0xFFFF;
    const uint32_t value = slot >> (16 - bits);
    x = ((x >> 16) << (16 - bits)) + (slot & ((1u << (16 - bits)) - 1));
    Renormalize(x);
    return value;
  }
  // A branch: states renormalise every ~8 decisions here, and a branch-free version would
  // chain both states through the word counter.
  ARC_V3_RANS_INLINE void Renormalize(uint32_t& x) {
    if (__builtin_expect(x >= kRansLow, 1)) return;
    if (next_ == num_words_) {
      bad_ = true;  // the state stays below 2^16
      return;
    }
    x = (x << 16) | words_[2 * next_] | (uint32_t{words_[2 * next_ + 1]} << 8);
    ++next_;
  }

  const RansModel& model_;
  const uint8_t* words_;
  size_t num_words_;
  size_t next_ = 0;
  bool bad_ = false;
};

Status Corrupt(const char* what) {
  return Status(ErrorCode::kCorruptChunk, std::string("rANS chunk: ") + what);
}

// ---------------------------------------------------------------------------------------
// EncodeChunkRans's steps.

// What the encoder counts over a chunk to fit its model.
struct RansTallies {
  // Elements and changes by history class (0 without a history) and exponent.
  uint64_t all[kRansHistoryClasses][256] = {};
  uint64_t changed[kRansHistoryClasses][256] = {};
  // +-1 steps by history class, direction (0 up, 1 down) and exponent; with a history only.
  uint64_t steps[kRansHistoryClasses][2][256] = {};
  // The value decisions "|d| >= 2^(j+1) given |d| >= 2^j" by z = e + j: [0] for j = 0
  // (every change makes one), [1] for j >= 1.
  uint64_t ones[2][kValueZ] = {};
  uint64_t zeros[2][kValueZ] = {};
  // The positions of the escapes (|d| >= 2), ascending.
  std::vector<uint32_t> escape_positions;
};

// Tallies the changes at `positions` (and, with a history, changes and steps by history
// class; without one, `changed` from the value decisions). The elements are TallyElements'.
void TallyRansChanges(const uint16_t* src, const uint16_t* dst, const uint32_t* positions,
                      size_t changes, const uint8_t* history, RansTallies& t) {
  t.escape_positions.reserve(changes / 8);
  for (size_t r = 0; r < changes; ++r) {
    const uint32_t pos = positions[r];
    const int e = ExponentOf(src[pos]);
    const ValueCode code = ValueCodeOf(src[pos], dst[pos]);
    ++(code.cls > 0 ? t.ones : t.zeros)[0][e];
    if (history != nullptr) {
      // Indexed, not branched on: the direction is a coin flip to a branch predictor.
      const int h = RansHistoryClass(history[pos]);
      ++t.changed[h][e];
      t.steps[h][code.negative][e] += code.cls == 0;
    }
    if (code.cls == 0) continue;
    t.escape_positions.push_back(pos);
    for (int j = 1; j <= std::min(code.cls, kUnaryDecisions - 1); ++j) {
      ++(code.cls > j ? t.ones : t.zeros)[1][e + j];
    }
  }
  if (history == nullptr) {
    for (int e = 0; e < 256; ++e) t.changed[0][e] = t.ones[0][e] + t.zeros[0][e];
  }
}

// History_Up_Q (history classes 1 and 2, kClasses bytes each) for the classes of
// `class_base`. Returns the cost of all +-1 steps' directions: about a bit each for the
// steps of history class 0, the Up_Q codings' for the others.
uint64_t ChooseRansUpQ(const RansTallies& t, int class_base, uint8_t* up_q) {
  uint64_t cost = 0;
  uint64_t steps_without_history = 0;
  for (int e = 0; e < 256; ++e) steps_without_history += t.steps[0][0][e] + t.steps[0][1][e];
  cost += steps_without_history << 16;
  for (int h = 1; h < kRansHistoryClasses; ++h) {
    uint64_t class_ups[kClasses] = {}, class_downs[kClasses] = {};
    for (int e = 0; e < 256; ++e) {
      const int c = std::min(std::max(e - class_base, 0), kClasses - 1);
      class_ups[c] += t.steps[h][0][e];
      class_downs[c] += t.steps[h][1][e];
    }
    for (int c = 0; c < kClasses; ++c) {
      up_q[(h - 1) * kClasses + c] = BestUpQ(class_ups[c], class_downs[c], &cost);
    }
  }
  return cost;
}

// The header bytes that a history adds: History_Change_Q, then History_Up_Q.
constexpr size_t kRansHistoryQBytes = 4 * kClasses;

// Class_Base and Change_Q, and with a history its kRansHistoryQBytes (history_q). The
// history pays for its header bytes, or the chunk is coded without it.
// Returns whether the chunk is coded with the history.
bool ChooseRansPositions(const RansTallies& t, bool with_history, uint8_t* class_base,
                         uint8_t* change_q, uint8_t* history_q) {
  uint64_t cost = ChoosePositionModel(t.all, t.changed, with_history ? kRansHistoryClasses : 1,
                                      class_base, change_q);
  if (!with_history) return false;
  std::memcpy(history_q, change_q + kClasses, 2 * kClasses);
  cost += ChooseRansUpQ(t, *class_base, history_q + 2 * kClasses);
  uint64_t all_plain[1][256] = {}, changed_plain[1][256] = {};
  uint64_t all_steps = 0;
  for (int h = 0; h < kRansHistoryClasses; ++h) {
    for (int e = 0; e < 256; ++e) {
      all_plain[0][e] += t.all[h][e];
      changed_plain[0][e] += t.changed[h][e];
      all_steps += t.steps[h][0][e] + t.steps[h][1][e];
    }
  }
  uint8_t plain_base = 0;
  uint8_t plain_q[kClasses] = {};  // ChoosePositionModel always fills it
  const uint64_t plain_cost =
      ChoosePositionModel(all_plain, changed_plain, 1, &plain_base, plain_q) + (all_steps << 16);
  if (cost + ((8 * kRansHistoryQBytes) << 16) < plain_cost) return true;
  *class_base = plain_base;
  std::memcpy(change_q, plain_q, kClasses);
  return false;
}

// The escape stream in decoding order, as u16 units: the states (low half first), then
// the words (the reverse of their coding order). The k-th escape goes on state
// k % kEscapeLanes: the log2 class, then the low bits and the sign as one uniform symbol
// (decoded in that order).
void EncodeRansEscapes(const uint16_t* src, const uint16_t* dst, const RansModel& model,
                       const std::vector<uint32_t>& escape_positions,
                       std::vector<uint16_t>* escape_units) {
  std::vector<uint16_t> escape_words;
  uint32_t escape_states[kEscapeLanes] = {kRansLow, kRansLow};
  EncSymbol symbols[kClasses][kEscapeClasses + 1];
  for (int c = 0; c < kClasses; ++c) {
    for (int j = 1; j <= kEscapeClasses; ++j) {
      const uint32_t* start = model.escape_start[c];
      symbols[c][j] = MakeSymbol(start[j], start[j + 1] - start[j]);
    }
  }
  RansEncoder coder(&escape_words);
  for (size_t k = escape_positions.size(); k-- > 0;) {
    const uint32_t pos = escape_positions[k];
    const ValueCode code = ValueCodeOf(src[pos], dst[pos]);
    uint32_t* x = &escape_states[k % kEscapeLanes];
    coder.PutUniform(x, (code.low_bits << 1) | code.negative, code.cls + 1);
    coder.Put(x, symbols[model.ClassOf(src[pos])][code.cls]);
  }
  escape_units->reserve(2 * kEscapeLanes + escape_words.size());
  for (const uint32_t state : escape_states) {
    escape_units->push_back(static_cast<uint16_t>(state));
    escape_units->push_back(static_cast<uint16_t>(state >> 16));
  }
  escape_units->insert(escape_units->end(), escape_words.rbegin(), escape_words.rend());
}

// Class_Base, Change_Q, Value_Log, Value_Slope and (history_q not null) the history's bytes.
void AppendRansHeader(uint8_t class_base, const uint8_t* change_q, const uint16_t* value_log,
                      const uint8_t* value_slope, const uint8_t* history_q,
                      std::vector<uint8_t>* out) {
  out->push_back(class_base);
  out->insert(out->end(), change_q, change_q + kClasses);
  for (int k = 0; k < 2; ++k) {
    out->push_back(static_cast<uint8_t>(value_log[k]));
    out->push_back(static_cast<uint8_t>(value_log[k] >> 8));
  }
  out->insert(out->end(), value_slope, value_slope + 2);
  if (history_q != nullptr) out->insert(out->end(), history_q, history_q + kRansHistoryQBytes);
}

// ---------------------------------------------------------------------------------------
// DecodeChunkRans's steps.

// The parts of a chunk's bytes after its header.
struct RansChunkStreams {
  uint64_t element_words;
  const uint8_t* element_stream;  // kElementStateBytes of states, then the words
  const uint8_t* escape_tail;     // the escape units past the element states' ends
  size_t tail_bytes;
};

// Reads the header (kHistoryHeaderBytes with a history, kHeaderBytes without) and the
// element word count, and checks that the streams fit the bytes.
Status ParseRansChunk(const uint8_t* bytes, size_t size, bool with_history, const uint8_t** header,
                      RansChunkStreams* streams) {
  ByteReader reader(bytes, size);
  if (!reader.ReadSpan(with_history ? kHistoryHeaderBytes : kHeaderBytes, header)) {
    return Status(ErrorCode::kTruncated, "rANS chunk: header truncated");
  }
  bool ran_out = false;
  if (!reader.ReadVarint(&streams->element_words, &ran_out)) {
    return ran_out ? Status(ErrorCode::kTruncated, "rANS chunk: header truncated")
                   : Corrupt("bad word count");
  }
  const size_t rest = reader.remaining();
  if (rest < kElementStateBytes || streams->element_words > (rest - kElementStateBytes) / 2) {
    return Status(ErrorCode::kTruncated, "rANS chunk: streams truncated");
  }
  streams->element_stream = reader.current();
  streams->escape_tail = streams->element_stream + kElementStateBytes + 2 * streams->element_words;
  streams->tail_bytes = static_cast<size_t>(bytes + size - streams->escape_tail);
  if (streams->tail_bytes % 2 != 0) return Corrupt("odd escape stream");
  return Status::Ok();
}

// The model a header (ParseRansChunk) describes.
RansModel RansModelOfHeader(const uint8_t* header, bool with_history) {
  const uint16_t value_log[2] = {
      static_cast<uint16_t>(header[1 + kClasses] | (header[2 + kClasses] << 8)),
      static_cast<uint16_t>(header[3 + kClasses] | (header[4 + kClasses] << 8))};
  const uint8_t value_slope[2] = {header[5 + kClasses], header[6 + kClasses]};
  return RansModel(header[0], header + 1, value_log, value_slope,
                   with_history ? header + kHeaderBytes : nullptr);
}

// An escape found in the element stream, its XOR still 0.
struct RansEscapeAt {
  uint32_t index;  // in the outputs
  uint16_t prev;   // src there
};

// The outputs of DecodeChunkRans, and the escapes still to decode.
struct RansDecodeOutput {
  std::vector<uint32_t>* positions;
  std::vector<uint16_t>* xors;
  std::vector<RansEscapeAt> escapes;
};

// Decodes the element stream from `states` (left where the stream ends), in slices of
// the chunk (a multiple of kRansLanes, so each element keeps its state) through small
// buffers: the outputs grow by the changes only. Escapes are noted with their src value
// while the slice is in cache. Returns the words used, or kRansWordsExhausted.
size_t DecodeRansSlices(const uint16_t* src, size_t len, const uint8_t* history,
                        const RansModel& model, const RansChunkStreams& streams, uint32_t* states,
                        RansDecodeOutput& out) {
  constexpr size_t kSlice = 4096;
  uint32_t found_positions[kSlice + kRansLanes], found_xors[kSlice + kRansLanes];
  RansEscapeAt found_escapes[kSlice + kRansLanes + 1];
  size_t words_used = 0;
  for (size_t begin = 0; begin < len; begin += kSlice) {
    const size_t count = std::min(kSlice, len - begin);
    const size_t n = DecodeRansChanges(
        src + begin, count, model.class_base, model.change, model.splits, states,
        streams.element_stream + kElementStateBytes, streams.element_words, &words_used,
        found_positions, found_xors, history != nullptr ? history + begin : nullptr);
    if (n == kRansWordsExhausted) return kRansWordsExhausted;
    const size_t old_size = out.positions->size();
    out.positions->resize(old_size + n);
    out.xors->resize(old_size + n);
    uint32_t* position_out = out.positions->data() + old_size;
    uint16_t* xor_out = out.xors->data() + old_size;
    size_t slice_escapes = 0;
    for (size_t k = 0; k < n; ++k) {
      position_out[k] = static_cast<uint32_t>(begin) + found_positions[k];
      xor_out[k] = static_cast<uint16_t>(found_xors[k]);
      // Written for every change, kept for escapes: no branch to mispredict.
      found_escapes[slice_escapes] = {static_cast<uint32_t>(old_size + k),
                                      src[begin + found_positions[k]]};
      slice_escapes += found_xors[k] == 0;
    }
    out.escapes.insert(out.escapes.end(), found_escapes, found_escapes + slice_escapes);
  }
  return words_used;
}

// Decodes the escape stream into the XORs of out.escapes. It takes its first units from
// the element states' ends (each in [2^16, 2^17)), then the tail.
// Returns nullptr, or what is wrong with the streams.
const char* DecodeRansEscapes(const RansModel& model, const RansChunkStreams& streams,
                              const uint32_t* states, RansDecodeOutput& out) {
  std::vector<uint8_t> joined(2 * kLaneUnits + streams.tail_bytes);
  for (size_t s = 0; s < kRansLanes; ++s) {
    if ((states[s] >> 16) != 1) return "inconsistent streams";
    joined[2 * s] = static_cast<uint8_t>(states[s]);
    joined[2 * s + 1] = static_cast<uint8_t>(states[s] >> 8);
  }
  if (streams.tail_bytes > 0) {
    std::memcpy(joined.data() + 2 * kLaneUnits, streams.escape_tail, streams.tail_bytes);
  }
  const uint8_t* escape_stream = joined.data();
  const size_t escape_bytes = joined.size();
  uint32_t escape_state = LoadU32(escape_stream), other_escape_state = LoadU32(escape_stream + 4);
  if (escape_state < kRansLow || other_escape_state < kRansLow) return "bad coder state";
  const size_t escape_words = (escape_bytes - kEscapeStateBytes) / 2;
  EscapeDecoder escapes(model, escape_stream + kEscapeStateBytes, escape_words);
  uint16_t* xor_out = out.xors->data();
  for (const RansEscapeAt& escape : out.escapes) {
    // The escapes alternate between the two states.
    xor_out[escape.index] = escapes.Decode(escape_state, escape.prev);
    std::swap(escape_state, other_escape_state);
  }
  // Every word read; a stream shorter than the lane units leaves the rest of them zero
  // (and no tail).
  bool all_read = escapes.AllRead();
  if (streams.tail_bytes == 0 && !escapes.Failed()) {
    const uint8_t* unread = escape_stream + kEscapeStateBytes + 2 * escapes.WordsRead();
    all_read = std::all_of(unread, escape_stream + escape_bytes, [](uint8_t b) { return b == 0; });
  }
  if (!all_read || escape_state != kRansLow || other_escape_state != kRansLow) {
    return "inconsistent streams";
  }
  return nullptr;
}

}  // namespace

Status EncodeChunkRans(const uint16_t* src, const uint16_t* dst, size_t len,
                       const uint32_t* positions, size_t changes, std::vector<uint8_t>* out,
                       RansScratch* scratch, const uint8_t* history, bool* coded_with_history) {
  if (out == nullptr || src == nullptr || dst == nullptr || positions == nullptr) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkRans: null pointer");
  }
  if (len > kMaxRansChunk) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkRans: chunk too large");
  }
  if (changes == 0) return Status(ErrorCode::kInvalidArgument, "EncodeChunkRans: no changes");

  RansTallies tallies;
  if (history != nullptr) {
    TallyElements<true>(src, len, history, tallies.all);
  } else {
    TallyElements<false>(src, len, nullptr, tallies.all);
  }
  TallyRansChanges(src, dst, positions, changes, history, tallies);
  uint8_t class_base = 0;
  uint8_t change_q[kRansTables];
  uint8_t history_q[kRansHistoryQBytes];
  if (!ChooseRansPositions(tallies, history != nullptr, &class_base, change_q, history_q)) {
    history = nullptr;
  }
  if (coded_with_history != nullptr) *coded_with_history = history != nullptr;
  const ValueCurve curves[2] = {ChooseValueCurve(tallies.ones[0], tallies.zeros[0]),
                                ChooseValueCurve(tallies.ones[1], tallies.zeros[1])};
  const uint16_t value_log[2] = {curves[0].log, curves[1].log};
  const uint8_t value_slope[2] = {curves[0].slope, curves[1].slope};
  const RansModel model(class_base, change_q, value_log, value_slope,
                        history != nullptr ? history_q : nullptr);

  // Escapes first: their first kLaneUnits units (zeros past its end) start the element
  // states.
  std::vector<uint16_t> escape_units;
  EncodeRansEscapes(src, dst, model, tallies.escape_positions, &escape_units);

  // Elements, last to first, element i on state i % kRansLanes (a kernel: every element
  // is coded).
  RansScratch own_scratch;
  uint16_t* pushed = (scratch != nullptr ? scratch : &own_scratch)->Reserve(len + kRansLanes);
  uint32_t element_states[kRansLanes];
  for (size_t lane = 0; lane < kRansLanes; ++lane) {
    element_states[lane] = kRansLow + (lane < escape_units.size() ? escape_units[lane] : 0);
  }
  const size_t element_words = EncodeRansElements(src, dst, len, class_base, model.change,
                                                  model.splits, element_states, pushed, history);

  AppendRansHeader(class_base, change_q, value_log, value_slope,
                   history != nullptr ? history_q : nullptr, out);
  PutVarint(element_words, out);
  AppendStream(element_states, kRansLanes, pushed, element_words, out);
  for (size_t u = kLaneUnits; u < escape_units.size(); ++u) {
    out->push_back(static_cast<uint8_t>(escape_units[u]));
    out->push_back(static_cast<uint8_t>(escape_units[u] >> 8));
  }
  return Status::Ok();
}

Status DecodeChunkRans(const uint16_t* src, size_t len, const uint8_t* bytes, size_t size,
                       std::vector<uint32_t>* positions, std::vector<uint16_t>* xors,
                       const uint8_t* history) {
  if (positions == nullptr || xors == nullptr || (len > 0 && src == nullptr) ||
      (size > 0 && bytes == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "DecodeChunkRans: null pointer");
  }
  if (len > kMaxRansChunk) {
    return Status(ErrorCode::kInvalidArgument, "DecodeChunkRans: chunk too large");
  }
  positions->clear();
  xors->clear();
  const uint8_t* header;
  RansChunkStreams streams;
  ARC_V3_RETURN_IF_ERROR(ParseRansChunk(bytes, size, history != nullptr, &header, &streams));
  if (len == 0) return Corrupt("changes in 0 elements");

  const RansModel model = RansModelOfHeader(header, history != nullptr);
  uint32_t states[kRansLanes];
  for (size_t s = 0; s < kRansLanes; ++s) {
    states[s] = LoadU32(streams.element_stream + 4 * s);
    if (states[s] < kRansLow) return Corrupt("bad coder state");
  }

  // Up to 4 changes per word of the element stream (about that many at the densities rANS
  // is chosen for): room for them up front saves regrowing the outputs.
  const size_t expected = std::min<uint64_t>(len, streams.element_words * 4);
  positions->reserve(expected);
  xors->reserve(expected);
  const auto fail = [&](const char* what) {
    positions->clear();
    xors->clear();
    return Corrupt(what);
  };
  RansDecodeOutput decoded{positions, xors, {}};
  decoded.escapes.reserve(expected / 8);
  const size_t words_used = DecodeRansSlices(src, len, history, model, streams, states, decoded);
  if (words_used == kRansWordsExhausted) return fail("element stream exhausted");
  if (positions->empty() || words_used != streams.element_words) {
    return fail("inconsistent streams");
  }
  const char* error = DecodeRansEscapes(model, streams, states, decoded);
  if (error != nullptr) return fail(error);
  return Status::Ok();
}

}  // namespace arc_v3

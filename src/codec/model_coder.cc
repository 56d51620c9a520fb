// Context-modelled chunk coder (see model_coder.h for the model in short).
//
// Chunk bytes (a chunk without changes is 0 bytes):
//   byte 0   bits 0-2: log2(block size) - kMinModelBlockLog; bit 3: coded with a session
//            history; bit 4: value priors from L (the encoder always sets it); bit 5: the
//            contexts start from the model this chunk of the session ended on in its last
//            modelled step, not from priors (kModelCarried); bit 6: column signs
//            (kModelColumnSigns); bit 7: the rates are capped (kModelRateCap).
//   byte 1   L: the chunk's rate prior, 4 * log2(sum of element rates / changes), which
//            seeds every probability (so small chunks do not pay to learn them).
//   with history only: 1 byte, the rate boost (log2, 0..15) of the elements whose last
//            change was 3+ steps ago (those of 1 or 2 steps ago are coded first, one
//            decision each: CodeRecent).
//   2 bytes, with column signs only (byte 0 bit 6): the sign period P (u16
//            little-endian, 1..65535), the row length of the tensor the chunk holds.
//   1 byte, with capped rates only (byte 0 bit 7): the Rate_Cap, 0..32,
//            the largest rate log of the chunk's elements (kMaxRateLog without it).
//   then     one range-coded stream (LZMA-style binary range coder, 16-bit
//            probabilities) without its first byte (always 0) and without trailing zero
//            bytes (the decoder reads zeros past the end); it never ends in a 0 byte.
// Encoder and decoder run the same templated walk (CodeChunk), so the contexts cannot
// drift apart.
#include "src/codec/model_coder.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "src/codec/kernels.h"

namespace arc_v3 {
namespace {

// ---------------------------------------------------------------------------------------
// Rates. r = 2^a with a = clamp(kRateTopExponent - exponent, 0, kMaxRateLog) (kernels.h);
// zeros and denormals get the largest rate, where the adaptive contexts learn what they
// really do.
constexpr int kRateLogs = kMaxRateLog + 1;

struct RateTables {
  uint8_t log[256];  // by exponent field, before a chunk's cap
};
constexpr RateTables MakeRateTables() {
  RateTables tables{};
  for (int e = 0; e < 256; ++e) {
    tables.log[e] = static_cast<uint8_t>(std::min(std::max(kRateTopExponent - e, 0), kMaxRateLog));
  }
  return tables;
}
constexpr RateTables kRates = MakeRateTables();

// History classes with their own rate boost: none, changed 1 step ago, 2, 3+.
constexpr int kHistoryClasses = 4;
inline int HistoryClass(uint8_t history) {
  return std::min(history & kHistoryAgeMask, kHistoryClasses - 1);
}

// Recent elements (IsRecent in kernels.h): those whose last change was
// 1 or 2 steps ago. On the corpus such an element changes again with a small chance
// whatever its exponent, except the tiny weights, which change again most of the time: no
// rate proportional to 2^-exponent expresses that, so they are coded first, one decision
// each in the context of their age and rate log, and the bisection gives them rate 1
// (kRecentBoost, the boost of history classes 1 and 2) and skips them. Ages 1-2 only: at
// most twice the density in extra decisions per step.
constexpr int8_t kRecentBoost = -kMaxRateLog;
static_assert(kRecentAges == 2, "the recent elements are history classes 1 and 2");

// An element's rate under a chunk's cap (kModelRateCap), from its bits.
inline uint64_t CappedRate(uint16_t bits, int rate_cap) {
  return uint64_t{1} << std::min<int>(kRates.log[ExponentOf(bits)], rate_cap);
}

// 4 * log2(x) for x >= 1, the fraction taken linearly from the two bits below the top bit.
inline int Log2Q4(uint64_t x) {
  const int top = 63 - __builtin_clzll(x);
  const int frac =
      top >= 2 ? static_cast<int>((x >> (top - 2)) & 3) : static_cast<int>((x << (2 - top)) & 3);
  return 4 * top + frac;
}

// 2^(q/4) in Q16, clamped to [1, 2^48].
inline uint64_t Pow2Q4(int q) {
  static constexpr uint64_t kQuarter[4] = {65536, 77936, 92682, 110218};  // 2^(j/4) Q16
  int octave = q >> 2;                                                    // floor
  const uint64_t base = kQuarter[q & 3];
  if (octave >= 32) return uint64_t{1} << 48;
  if (octave >= 0) return base << octave;
  if (octave <= -34) return 1;
  return std::max<uint64_t>(base >> -octave, 1);
}

// ---------------------------------------------------------------------------------------
// Adaptive binary probabilities: p = P(bit = 1) in units of 2^-16, in [32, 65504].
constexpr int kProbBits = 16;
constexpr uint32_t kProbOne = 1u << kProbBits;
constexpr uint16_t kProbMin = 48, kProbMax = kProbOne - 48;  // for priors

}  // namespace

// Prob and Model (below) are named outside this file's anonymous namespace: a session's
// ModelState (model_coder.h, external linkage) holds a Model, and must not hold a type of
// internal linkage (GCC's -Wsubobject-linkage, once this file is part of a header:
// single_include/arc_v3.hpp).
namespace model_coder {

// Adaptation is fast while a context is young and slows to 2^-limit: a context that has
// seen n bits moves by about 1/(n + 2) (shift floor(log2(n + 2))). A prior that deserves
// trust starts with a larger n.
struct Prob {
  uint16_t p;
  uint8_t n;
  uint8_t limit;
  void Set(uint16_t prob, int seen, int max_shift) {
    p = prob;
    n = static_cast<uint8_t>(seen);
    limit = static_cast<uint8_t>(max_shift);
  }
};

}  // namespace model_coder

namespace {

using model_coder::Prob;

inline uint16_t ClampProb(uint64_t p) {
  return static_cast<uint16_t>(std::min<uint64_t>(std::max<uint64_t>(p, kProbMin), kProbMax));
}

// P = x / (1 + x) for an expected count x = 2^(q/4): the chance of at least one event
// (1 - e^-x) to within a few percent, without floating point.
inline uint16_t ProbFromLog(int q) {
  const uint64_t x = Pow2Q4(q);
  return ClampProb((x << kProbBits) / (x + 65536));
}

// floor(log2(n + 2)) for n < 256.
struct ShiftTable {
  uint8_t shift[256];
};
constexpr ShiftTable MakeShiftTable() {
  ShiftTable table{};
  for (int n = 0; n < 256; ++n) {
    int shift = 0;
    while ((2 << shift) <= n + 2) ++shift;
    table.shift[n] = static_cast<uint8_t>(shift);
  }
  return table;
}
constexpr ShiftTable kShifts = MakeShiftTable();

// Moves p towards 32 or 65504 (branch-free: the bits are unpredictable). The arithmetic
// shift rounds towards the target's side, so p stays in [32, 65504] and neither coder
// interval ever empties.
constexpr int kProbFloor = 32;
inline void Update(Prob* prob, int bit) {
  const int shift = std::min<int>(kShifts.shift[prob->n], prob->limit);
  const int32_t target = kProbFloor + bit * static_cast<int32_t>(kProbOne - 2 * kProbFloor);
  prob->p = static_cast<uint16_t>(prob->p + ((target - static_cast<int32_t>(prob->p)) >> shift));
  prob->n = static_cast<uint8_t>(prob->n + (prob->n < 255));
}

// Priors' weights (initial n) and final adaptation shifts, per kind of decision.
constexpr int kPositionSeen = 14, kPositionShift = 7;
// The split priors (a change is in a half with the chance of its share of the rate)
// count as if 126 decisions had been seen, so that they adapt at the final 1/128 from the
// start: adapting faster only follows noise.
constexpr int kTrustedSplitSeen = 126;
constexpr int kValueSeen = 2, kValueShift = 7;
// Value priors from L (Layout bit 4). The sign is a fair coin whatever the exponent: it
// starts at 1/2 as if 30 signs had been seen (adapting by 1/32, not 1/2, at first)
// instead of paying to learn 1/2 in every context. In a session the direction of the last
// change predicts it (most changes keep it), with a prior of about 6% for the other one.
constexpr int kSignSeen = 30;
constexpr uint16_t kSignAgainstHint = 4000;
constexpr int kSignHintSeen = 4;
// A recent element changes again with the chance its rate promises, but at least 655 / 2^16
// (about the corpus' rate for most exponents); few observations teach the rest.
constexpr uint16_t kRecentPrior = 655;

// ---------------------------------------------------------------------------------------
// Range coder (the LZMA construction with 16-bit probabilities).
constexpr uint32_t kTopValue = 1u << 24;

class RangeEncoder {
 public:
  explicit RangeEncoder(std::vector<uint8_t>* out) : out_(out), start_(out->size()) {}

  inline void Encode(Prob* prob, int bit) {
    const uint32_t bound = (range_ >> kProbBits) * prob->p;
    const uint32_t mask = 0u - static_cast<uint32_t>(bit);
    low_ += bound & ~mask;
    range_ = (bound & mask) | ((range_ - bound) & ~mask);
    Update(prob, bit);
    while (range_ < kTopValue) {
      range_ <<= 8;
      ShiftLow();
    }
  }

  // Ends the stream with the value in [low, low + range) that has the most trailing zero
  // bits, then drops the trailing zero bytes: the decoder reads zeros past the end.
  void Finish() {
    for (int k = 32; k >= 0; --k) {
      const uint64_t mask = (uint64_t{1} << k) - 1;
      const uint64_t value = (low_ + mask) & ~mask;
      if (value < low_ + range_) {
        low_ = value;
        break;
      }
    }
    for (int i = 0; i < 5; ++i) ShiftLow();
    while (out_->size() > start_ && out_->back() == 0) out_->pop_back();
  }

 private:
  void ShiftLow() {
    if (static_cast<uint32_t>(low_) < 0xFF000000u || (low_ >> 32) != 0) {
      const uint8_t carry = static_cast<uint8_t>(low_ >> 32);
      uint8_t byte = cache_;
      do {
        // The very first byte is always 0 (the interval starts inside [0, 2^32)): omitted.
        if (skip_first_) {
          skip_first_ = false;
        } else {
          out_->push_back(static_cast<uint8_t>(byte + carry));
        }
        byte = 0xFF;
      } while (--cache_size_ != 0);
      cache_ = static_cast<uint8_t>(low_ >> 24);
    }
    ++cache_size_;
    low_ = (low_ & 0x00FFFFFFu) << 8;
  }

  std::vector<uint8_t>* out_;
  size_t start_;
  uint64_t low_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint8_t cache_ = 0;
  uint64_t cache_size_ = 1;
  bool skip_first_ = true;
};

class RangeDecoder {
 public:
  RangeDecoder(const uint8_t* begin, const uint8_t* end) : next_(begin), end_(end) {
    for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | NextByte();
  }

  inline int Decode(Prob* prob) {
    const uint32_t bound = (range_ >> kProbBits) * prob->p;
    const int bit = code_ < bound;
    const uint32_t mask = 0u - static_cast<uint32_t>(bit);
    code_ -= bound & ~mask;
    range_ = (bound & mask) | ((range_ - bound) & ~mask);
    Update(prob, bit);
    while (range_ < kTopValue) {
      range_ <<= 8;
      code_ = (code_ << 8) | NextByte();
    }
    return bit;
  }

  // A valid stream keeps code < range, and the decoder reads all of it (the zeros it
  // reads past the end are the ones the encoder dropped).
  bool Valid() const { return code_ < range_ && next_ == end_; }

 private:
  inline uint32_t NextByte() { return next_ < end_ ? *next_++ : 0; }

  const uint8_t* next_;
  const uint8_t* end_;
  uint32_t code_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
};

// ---------------------------------------------------------------------------------------
// The model's contexts.
constexpr int kBlockBuckets = 4 * 48;  // Log2Q4 of S <= 2^8 * 2^32, with room
constexpr int kNodeLevels = 16;        // expected changes in a node, by octaves
constexpr int kSplitBuckets = 64;      // the left half's share of the node's rate
constexpr int kAlsoBuckets = 96;       // expected changes in the right half
constexpr int kUnaryBits = 15;         // |d| < 2^16: log2 class 0..15

}  // namespace

namespace model_coder {

struct Model {
  Prob block[kBlockBuckets];               // the block has a change
  Prob split[kNodeLevels][kSplitBuckets];  // left half changed | node changed
  Prob also[kAlsoBuckets];                 // right half changed | left half changed
  Prob unary[kRateLogs][kUnaryBits];
  Prob bits[16][16];                    // [log2 class][bit position]
  Prob sign[3][2][kRateLogs];           // [history hint][sign of prev][rate log]
  Prob column_sign[3][4];               // [history hint][column state -2, -1, +1, +2]
  Prob recent[kRecentAges][kRateLogs];  // [age - 1][rate log]: a recent element changed

  // Priors from the chunk's rate prior L: elements with summed rate S expect
  // x = S / 2^(L/4) changes. `value_priors`: Layout bit 4 (below).
  Model(int L, bool value_priors) {
    const int split_seen = kTrustedSplitSeen;
    for (int b = 0; b < kBlockBuckets; ++b) {
      block[b].Set(ProbFromLog(b - L), kPositionSeen, kPositionShift);
    }
    for (auto& level : split) {
      // Few expected changes: the change is in the left half with the chance of its
      // share of the rate.
      for (int t = 0; t < kSplitBuckets; ++t) {
        const uint64_t share = Pow2Q4(-(t < 32 ? 31 - t : t - 32));
        level[t].Set(ClampProb(t < 32 ? share : kProbOne - share), split_seen, kPositionShift);
      }
    }
    for (int t = 0; t < kAlsoBuckets; ++t) {
      also[t].Set(ProbFromLog(t - 64), kPositionSeen, kPositionShift);
    }
    for (int a = 0; a < kRateLogs; ++a) {
      for (int j = 0; j < kUnaryBits; ++j) {
        // Without value priors: |d| = 1 for most changes, each further class rarer.
        // With them: an element whose expected change count x = 2^(a - L/4) is large
        // moves by more than one ULP; P(class > j | class >= j) = x / 2^j / (1 + x / 2^j)
        // follows the corpus' measured curve to within about half an octave.
        const uint16_t p = value_priors ? ProbFromLog(4 * (a - j) - L) : j == 0 ? 7000 : 24000;
        unary[a][j].Set(p, kValueSeen, kValueShift);
      }
      for (int hint = 0; hint < 3; ++hint) {
        uint16_t p_negative = kProbOne / 2;
        int seen = kValueSeen;
        if (value_priors) {
          // Hint 1: the last change went up (so this one is unlikely to be negative).
          p_negative = hint == 0   ? kProbOne / 2
                       : hint == 1 ? kSignAgainstHint
                                   : static_cast<uint16_t>(kProbOne - kSignAgainstHint);
          seen = hint == 0 ? kSignSeen : kSignHintSeen;
        }
        sign[hint][0][a].Set(p_negative, seen, kValueShift);
        sign[hint][1][a].Set(p_negative, seen, kValueShift);
      }
    }
    for (auto& row : bits) {
      for (auto& prob : row) prob.Set(kProbOne / 2, kValueSeen, kValueShift);
    }
    for (auto& row : column_sign) {
      for (auto& prob : row) prob.Set(kProbOne / 2, kValueSeen, kValueShift);
    }
    for (auto& by_rate : recent) {
      for (int a = 0; a < kRateLogs; ++a) {
        by_rate[a].Set(std::max(ProbFromLog(4 * a - L), kRecentPrior), kValueSeen, kPositionShift);
      }
    }
  }
};

}  // namespace model_coder

namespace {

using model_coder::Model;

// Column signs (Layout bit 6): within a weight matrix the updates of one column (an input
// feature) share their sign more often than chance (a sign costs less than a bit in the
// context of its column's earlier signs: docs/format_notes.md). With period P,
// the row length, element i of the chunk is in column i mod P; each column keeps a counter
// of its changes' signs so far in the chunk (+1 for each negative, -1 for each positive,
// clamped to [-2, 2]), and a change in a column whose counter is not 0 codes its sign in
// the context of the counter.
constexpr int kColumnLimit = 2;
class ColumnSigns {
 public:
  explicit ColumnSigns(uint32_t period) : period_(period), counters_(period) {}
  // The counter of element i's column, or nullptr without column signs (period 0).
  inline int8_t* At(size_t i) { return period_ != 0 ? &counters_[i % period_] : nullptr; }
  static inline void Update(int8_t* counter, int negative) {
    const int next = *counter + (negative ? 1 : -1);
    *counter = static_cast<int8_t>(std::min(std::max(next, -kColumnLimit), kColumnLimit));
  }
  // The column_sign context of a counter that is not 0.
  static inline int Index(int8_t counter) { return counter + (counter < 0 ? 2 : 1); }

 private:
  uint32_t period_;
  std::vector<int8_t> counters_;
};

}  // namespace

struct ModelState {
  Model model;
};
void ModelStateDeleter::operator()(ModelState* state) const { delete state; }

namespace {

// The walk shared by encoder and decoder. `Io` supplies the truth when encoding
// (BlockChanged, NodeChanged, Target) and receives the result when decoding (Emit); its
// Code(prob, bit) encodes `bit` and returns it, or decodes and returns a bit.
template <class Io>
inline uint16_t CodeValue(Io* io, Model* model, uint16_t prev, uint16_t next, int hint,
                          int8_t* column) {
  const uint16_t key = MonotoneKey(prev);
  const int a = kRates.log[ExponentOf(prev)];
  // Encoder side: d in [-32768, 32767] \ {0}, as magnitude and sign.
  const int d = static_cast<int16_t>(static_cast<uint16_t>(MonotoneKey(next) - key));
  const int negative_in = d < 0;
  const uint32_t magnitude_in = static_cast<uint32_t>(d < 0 ? -d : d);
  const int class_in = magnitude_in ? 31 - __builtin_clz(magnitude_in) : 0;

  int cls = 0;
  while (cls < kUnaryBits && io->Code(&model->unary[a][cls], class_in > cls)) ++cls;
  uint32_t magnitude = 1;
  for (int b = cls - 1; b >= 0; --b) {
    magnitude = 2 * magnitude + io->Code(&model->bits[cls][b], (magnitude_in >> b) & 1);
  }
  Prob* sign = &model->sign[hint][prev >> 15][a];
  if (column != nullptr && *column != 0) {
    sign = &model->column_sign[hint][ColumnSigns::Index(*column)];
  }
  const int negative = io->Code(sign, negative_in);
  if (column != nullptr) ColumnSigns::Update(column, negative);
  const uint16_t step = static_cast<uint16_t>(negative ? 0u - magnitude : magnitude);
  return static_cast<uint16_t>(prev ^ FromMonotoneKey(static_cast<uint16_t>(key + step)));
}

// Rate sums of groups of 4 elements, computed by the rates' kernel (GroupSums) a window
// of groups at a time. Sum(rates, begin, end) serves the blocks in ascending order (begin
// a multiple of 4, end - begin at most 4 * kWindowGroups).
template <class Rates>
class GroupWindow {
 public:
  explicit GroupWindow(size_t len) : groups_(len / 4) {}

  inline uint64_t Sum(const Rates& rates, size_t begin, size_t end) {
    const size_t first = begin / 4, last = end / 4;  // the whole groups
    // Refilled before the loop, so that the loop itself is plain adds.
    if (last > first && (last > window_end_ || first < window_begin_)) {
      window_begin_ = first;
      window_end_ = std::min(first + kWindowGroups, groups_);
      rates.GroupSums(first, window_end_ - first, window_);
    }
    uint64_t sum = 0;
    for (size_t g = first; g < last; ++g) sum += window_[g - window_begin_];
    for (size_t i = 4 * last; i < end; ++i) sum += rates.Rate(i);
    return sum;
  }

 private:
  static constexpr size_t kWindowGroups = 1024;
  size_t groups_;
  size_t window_begin_ = 0;
  size_t window_end_ = 0;
  uint64_t window_[kWindowGroups];
};

// The sign context of an element's history byte: 0 no change recorded, 1 the last one
// went up, 2 down.
inline int HintOf(uint8_t history) {
  return (history & kHistoryAgeMask) == 0 ? 0 : (history & kHistoryUp) ? 1 : 2;
}

// Element rates without history: by exponent alone.
class PlainRates {
 public:
  PlainRates(const uint16_t* src, size_t len, int rate_cap)
      : src_(src), rate_cap_(rate_cap), window_(len) {}
  inline uint64_t Rate(size_t i) const { return CappedRate(src_[i], rate_cap_); }
  inline int Hint(size_t) const { return 0; }
  // The rate sum of [begin, end); blocks in ascending order.
  inline uint64_t Sum(size_t begin, size_t end) { return window_.Sum(*this, begin, end); }
  void GroupSums(size_t first, size_t count, uint64_t* sums) const {
    GroupRateSums(src_ + 4 * first, count, rate_cap_, sums);
  }

 private:
  const uint16_t* src_;
  int rate_cap_;
  GroupWindow<PlainRates> window_;
};

// With a session's history: an element that changed recently gets its rate multiplied by
// 2^boost of its history class (sent in the chunk header), within the cap, and the
// direction of its last change is the context of its sign. The recent elements, coded
// before the bisection, have the boost kRecentBoost (rate 1).
class HistoryRates {
 public:
  HistoryRates(const uint16_t* src, const uint8_t* history, size_t len,
               const int8_t boosts[kHistoryClasses], int rate_cap)
      : src_(src), history_(history), rate_cap_(rate_cap), window_(len) {
    for (int age = 0; age <= kHistoryAgeMask; ++age) {
      boost_[age] = boosts[HistoryClass(static_cast<uint8_t>(age))];
    }
  }
  inline uint64_t Rate(size_t i) const {
    const int a = std::min<int>(kRates.log[ExponentOf(src_[i])], rate_cap_) +
                  boost_[history_[i] & kHistoryAgeMask];
    return uint64_t{1} << std::min(std::max(a, 0), rate_cap_);
  }
  inline uint64_t Sum(size_t begin, size_t end) { return window_.Sum(*this, begin, end); }
  void GroupSums(size_t first, size_t count, uint64_t* sums) const {
    HistoryRateSums(src_ + 4 * first, history_ + 4 * first, boost_, count, rate_cap_, sums);
  }
  inline int Hint(size_t i) const { return HintOf(history_[i]); }

 private:
  const uint16_t* src_;
  const uint8_t* history_;
  int rate_cap_;
  int8_t boost_[kHistoryAgeMask + 1];
  GroupWindow<HistoryRates> window_;
};

// Codes the changes of elements [begin, end) of a block, known to hold at least one:
// whether the left half has one (from its share of the node's rate), and if so whether
// the right half has one too (from its own rate). `prefix` holds the block's prefix rate
// sums, indexed from the block's start `base`.
template <class Io, class Rates>
void CodeNode(Io* io, Model* model, const uint16_t* src, const Rates& rates, ColumnSigns* columns,
              const uint64_t* prefix, size_t base, size_t begin, size_t end, int L) {
  while (end - begin > 1) {
    const size_t mid = begin + (end - begin) / 2;
    const uint64_t left = prefix[mid - base] - prefix[begin - base];
    const uint64_t right = prefix[end - base] - prefix[mid - base];
    const int whole = Log2Q4(left + right);
    const int level = std::min(std::max((whole - L + 48) >> 2, 0), kNodeLevels - 1);
    const int t = left <= right ? 31 - std::min(whole - Log2Q4(left), 31)
                                : 32 + std::min(whole - Log2Q4(right), 31);
    if (!io->Code(&model->split[level][t], io->NodeChanged(begin, mid))) {
      begin = mid;  // the change is on the right
      continue;
    }
    const int q = std::min(std::max(Log2Q4(right) - L + 64, 0), kAlsoBuckets - 1);
    if (!io->Code(&model->also[q], io->NodeChanged(mid, end))) {
      end = mid;
      continue;
    }
    CodeNode(io, model, src, rates, columns, prefix, base, begin, mid, L);  // left first
    begin = mid;
  }
  io->Emit(begin, CodeValue(io, model, src[begin], io->Target(begin), rates.Hint(begin),
                            columns->At(begin)));
}

// Whether each recent element changed, in ascending order, and if so its value.
template <class Io>
void CodeRecent(Io* io, Model* model, const uint16_t* src, const uint8_t* history, size_t len,
                ColumnSigns* columns) {
  constexpr size_t kWindow = 4096;
  uint32_t recent[kWindow];
  for (size_t begin = 0; begin < len; begin += kWindow) {
    const size_t found = RecentPositions(history + begin, std::min(kWindow, len - begin), recent);
    for (size_t k = 0; k < found; ++k) {
      const size_t i = begin + recent[k];
      const uint8_t h = history[i];
      Prob* prob = &model->recent[(h & kHistoryAgeMask) - 1][kRates.log[ExponentOf(src[i])]];
      if (io->Code(prob, io->RecentChanged(i))) {
        io->EmitRecent(i, CodeValue(io, model, src[i], io->Target(i), HintOf(h), columns->At(i)));
      }
    }
  }
}

// The recent elements come first (if `recent_history` is not null: CodeRecent), then the
// bisection's positions; each come out ascending (a left half is finished before its
// right half).
// `block_sums`, if not null, holds rates.Sum of every block (the encoder has them already).
template <class Io, class Rates>
void CodeChunk(const uint16_t* src, Rates& rates, size_t len, int log2_block, int L,
               bool value_priors, uint32_t sign_period, const CarriedModel& carried, Io* io,
               const uint64_t* block_sums = nullptr, const uint8_t* recent_history = nullptr) {
  ColumnSigns columns(sign_period);
  auto model = carried.start != nullptr ? std::make_unique<Model>(carried.start->model)
                                        : std::make_unique<Model>(L, value_priors);
  if (recent_history != nullptr) {
    CodeRecent(io, model.get(), src, recent_history, len, &columns);
  }
  const size_t block = size_t{1} << log2_block;
  uint64_t prefix[(size_t{1} << kMaxModelBlockLog) + 1];
  for (size_t begin = 0; begin < len; begin += block) {
    const size_t end = std::min(begin + block, len);
    const uint64_t sum =
        block_sums != nullptr ? block_sums[begin >> log2_block] : rates.Sum(begin, end);
    const int bucket = std::min(Log2Q4(sum), kBlockBuckets - 1);
    const int any = io->Code(&model->block[bucket], io->BlockChanged(begin, end));
    if (!any) continue;
    uint64_t running = 0;
    prefix[0] = 0;
    for (size_t i = begin; i < end; ++i) {
      running += rates.Rate(i);
      prefix[i - begin + 1] = running;
    }
    io->BeginBlock(begin, end);
    CodeNode(io, model.get(), src, rates, &columns, prefix, begin, begin, end, L);
    io->EndBlock();
  }
  if (carried.end != nullptr) carried.end->reset(new ModelState{*model});
}

class EncoderIo {
 public:
  // `changed` lists the positions the bisection codes, ascending: the chunk's changes,
  // without the recent elements' where those are coded first (CodeRecent).
  EncoderIo(const uint16_t* src, const uint16_t* dst, const std::vector<uint32_t>* changed,
            std::vector<uint8_t>* out)
      : src_(src), dst_(dst), changed_(changed), coder_(out) {}
  inline int Code(Prob* prob, int bit) {
    coder_.Encode(prob, bit);
    return bit;
  }
  // Blocks come in ascending order.
  inline int BlockChanged(size_t begin, size_t end) {
    while (next_ < changed_->size() && (*changed_)[next_] < begin) ++next_;
    return next_ < changed_->size() && (*changed_)[next_] < end;
  }
  // Prefix counts of the block's changes in `changed`, for NodeChanged (BlockChanged left
  // next_ at the block's first).
  inline void BeginBlock(size_t begin, size_t end) {
    base_ = begin;
    counts_[0] = 0;
    size_t k = next_;
    for (size_t i = begin; i < end; ++i) {
      const bool listed = k < changed_->size() && (*changed_)[k] == i;
      k += listed;
      counts_[i - begin + 1] = static_cast<uint16_t>(counts_[i - begin] + listed);
    }
  }
  inline void EndBlock() {}
  inline int NodeChanged(size_t begin, size_t end) const {
    return counts_[end - base_] != counts_[begin - base_];
  }
  inline uint16_t Target(size_t i) const { return dst_[i]; }
  inline void Emit(size_t, uint16_t) {}
  inline int RecentChanged(size_t i) const { return src_[i] != dst_[i]; }
  inline void EmitRecent(size_t, uint16_t) {}
  void Finish() { coder_.Finish(); }

 private:
  size_t base_ = 0;
  size_t next_ = 0;  // first entry of changed_ not before the current block
  uint16_t counts_[(size_t{1} << kMaxModelBlockLog) + 1];
  const uint16_t* src_;
  const uint16_t* dst_;
  const std::vector<uint32_t>* changed_;
  RangeEncoder coder_;
};

class DecoderIo {
 public:
  DecoderIo(const uint8_t* begin, const uint8_t* end, std::vector<uint32_t>* positions,
            std::vector<uint16_t>* xors)
      : coder_(begin, end), positions_(positions), xors_(xors) {}
  inline int Code(Prob* prob, int) { return coder_.Decode(prob); }
  inline int BlockChanged(size_t, size_t) const { return 0; }
  inline void BeginBlock(size_t, size_t) {}
  inline void EndBlock() {}
  inline int NodeChanged(size_t, size_t) const { return 0; }
  inline uint16_t Target(size_t) const { return 0; }
  inline void Emit(size_t i, uint16_t x) {
    positions_->push_back(static_cast<uint32_t>(i));
    xors_->push_back(x);
  }
  inline int RecentChanged(size_t) const { return 0; }
  inline void EmitRecent(size_t i, uint16_t x) {
    recent_positions_.push_back(static_cast<uint32_t>(i));
    recent_xors_.push_back(x);
  }
  const RangeDecoder& coder() const { return coder_; }

  // Merges the recent elements' changes into the bisection's (both ascending).
  // @return false if the bisection placed a change on a recent element (corrupt input:
  // the encoder never does, and the two lists would overlap).
  bool MergeRecent(const uint8_t* history) {
    for (const uint32_t position : *positions_) {
      if (IsRecent(history[position])) return false;
    }
    // From the back, in place: the bisection's entries move up to their final places
    // before anything overwrites them.
    size_t b = positions_->size(), r = recent_positions_.size();
    positions_->resize(b + r);
    xors_->resize(b + r);
    while (r > 0) {
      const size_t k = b + r - 1;
      if (b > 0 && (*positions_)[b - 1] > recent_positions_[r - 1]) {
        --b;
        (*positions_)[k] = (*positions_)[b];
        (*xors_)[k] = (*xors_)[b];
      } else {
        --r;
        (*positions_)[k] = recent_positions_[r];
        (*xors_)[k] = recent_xors_[r];
      }
    }
    return true;
  }

 private:
  RangeDecoder coder_;
  std::vector<uint32_t>* positions_;
  std::vector<uint16_t>* xors_;
  std::vector<uint32_t> recent_positions_;
  std::vector<uint16_t> recent_xors_;
};

constexpr uint8_t kBlockLogMask = 0x07;

// Block size for a density: about one expected change per four blocks (measured on the
// corpus, the size barely changes the ratio; this is the fastest to decode).
int ChooseBlockLog(size_t changes, size_t len) {
  int log2_block = 6;
  while (log2_block > kMinModelBlockLog && (changes << (log2_block + 2)) > len) --log2_block;
  return log2_block;
}

// Boost of a history class: log2 of how much likelier its elements changed in this chunk
// than elements without history, rate for rate (rounded octaves, 0..15).
uint8_t EstimateBoost(uint64_t changes, uint64_t rate_sum, uint64_t base_changes,
                      uint64_t base_rate_sum) {
  if (changes == 0) return 0;
  if (base_changes == 0) return 15;
  const int q =
      (Log2Q4(changes) - Log2Q4(rate_sum)) - (Log2Q4(base_changes) - Log2Q4(base_rate_sum));
  return static_cast<uint8_t>(std::min(std::max((q + 2) / 4, 0), 15));
}

// The cost of an adaptive binary context that ends on counts a and b, in 2^-16 bits: about
// n H(a / n) + log2(n) / 2 for n = a + b (the entropy plus the price of learning it).
uint64_t ContextCost(uint64_t a, uint64_t b) {
  const auto n_log_n = [](uint64_t x) { return x == 0 ? 0 : x * Log2Q16(x); };
  const uint64_t n = a + b;
  return n == 0 ? 0 : n_log_n(n) - n_log_n(a) - n_log_n(b) + Log2Q16(n) / 2;
}

// The sign period among `candidates` (ascending) whose column counters save the most on
// the chunk's signs, estimated from the counts each context would end on (integers only,
// so every machine picks the same), or 0 where none saves more than its 2 header bytes
// and a margin. Where there are many candidates and changes, the first changes pick the
// three most promising, and only those are tried on all.
uint32_t ChooseSignPeriod(const uint16_t* src, const uint16_t* dst,
                          const std::vector<uint32_t>& changed, const uint8_t* history,
                          const std::vector<uint32_t>& candidates) {
  // Below this many changes even the corpus' column coherence saves less than the margin:
  // not worth the estimate.
  constexpr size_t kMinChanges = 256;
  if (candidates.empty() || changed.size() < kMinChanges) return 0;
  std::vector<uint8_t> signs(changed.size());  // bit 0: negative; bits 1-2: history hint
  for (size_t k = 0; k < changed.size(); ++k) {
    const uint32_t i = changed[k];
    const int negative = static_cast<int16_t>(MonotoneKey(dst[i]) - MonotoneKey(src[i])) < 0;
    const int hint = history != nullptr ? HintOf(history[i]) : 0;
    signs[k] = static_cast<uint8_t>(negative | hint << 1);
  }
  // The cost of the first n signs with column counters of `period` (0: without).
  std::vector<int8_t> counters;
  const auto cost = [&](uint32_t period, size_t n) {
    counters.assign(std::max<uint32_t>(period, 1), 0);
    // i mod period without a division: for i < 2^24 and period <= 2^16, the quotient is
    // i * ceil(2^40 / period) >> 40 exactly.
    const uint64_t reciprocal = period != 0 ? ((uint64_t{1} << 40) + period - 1) / period : 0;
    uint64_t counts[3][2 * kColumnLimit + 1][2] = {};
    for (size_t k = 0; k < n; ++k) {
      const uint32_t row = static_cast<uint32_t>((changed[k] * reciprocal) >> 40);
      int8_t* counter = &counters[period != 0 ? changed[k] - row * period : 0];
      const int negative = signs[k] & 1;
      ++counts[signs[k] >> 1][*counter + kColumnLimit][negative];
      if (period != 0) ColumnSigns::Update(counter, negative);
    }
    uint64_t total = 0;
    for (const auto& hint : counts) {
      for (const auto& state : hint) total += ContextCost(state[0], state[1]);
    }
    return total;
  };
  std::vector<uint32_t> finalists = candidates;
  constexpr size_t kFinalists = 3, kScreenChanges = 512;
  if (finalists.size() > kFinalists && changed.size() > 2 * kScreenChanges) {
    std::vector<std::pair<uint64_t, uint32_t>> screened;  // (cost, period): ties by period
    for (const uint32_t period : candidates) {
      screened.emplace_back(cost(period, kScreenChanges), period);
    }
    std::partial_sort(screened.begin(), screened.begin() + kFinalists, screened.end());
    finalists.clear();
    for (size_t f = 0; f < kFinalists; ++f) finalists.push_back(screened[f].second);
    std::sort(finalists.begin(), finalists.end());
  }
  const uint64_t cost_without = cost(0, changed.size());
  constexpr uint64_t kMinSaving = uint64_t{32} << 16;  // bits: the header's 16, and as many
  uint64_t best_saving = kMinSaving;
  uint32_t best = 0;
  for (const uint32_t period : finalists) {
    const uint64_t cost_with = cost(period, changed.size());
    if (cost_with + best_saving < cost_without) {
      best_saving = cost_without - cost_with;
      best = period;
    }
  }
  return best;
}

// The cap the encoder gives a chunk's rates (kModelRateCap) unless the chunk is very
// sparse: on the corpus elements of rate 2^23 and above (weights below 2^-16) change in
// about half the steps, whatever their rate, so capping their rates saves payload; the
// ratio changes little between neighbouring caps (docs/format_notes.md).
constexpr int kDefaultRateCap = 24;
constexpr size_t kRateWindow = 4096;  // elements whose group sums GroupRateSums writes at once

// The rate sums of a chunk with rates capped at 2^rate_cap: the total in *total and, if
// step_sums is not null, the sum of each `step` elements (a power of two in [4, 4096]).
// @return the largest rate log of the elements before the cap.
int SumRates(const uint16_t* src, size_t len, int rate_cap, size_t step, uint64_t* step_sums,
             uint64_t* total) {
  uint64_t group_sums[kRateWindow / 4];
  int largest = 0;
  *total = 0;
  for (size_t begin = 0; begin < len; begin += kRateWindow) {
    const size_t end = std::min(begin + kRateWindow, len);
    const size_t groups = (end - begin) / 4;
    largest = std::max(largest, GroupRateSums(src + begin, groups, rate_cap, group_sums));
    uint64_t rest = 0;  // the elements after the last whole group (at the chunk's end)
    for (size_t i = begin + 4 * groups; i < end; ++i) {
      largest = std::max<int>(largest, kRates.log[ExponentOf(src[i])]);
      rest += CappedRate(src[i], rate_cap);
    }
    for (size_t first = begin; first < end; first += step) {
      const size_t last = std::min(first + step, end);
      uint64_t sum = last == end ? rest : 0;
      for (size_t g = (first - begin) / 4; g < std::min((last - begin) / 4, groups); ++g) {
        sum += group_sums[g];
      }
      if (step_sums != nullptr) step_sums[first / step] = sum;
      *total += sum;
    }
  }
  return largest;
}

// The Rate_Cap of a chunk with `total` changes, its rate sums in *all_rates and (not null)
// step_sums as SumRates writes them.
int ChooseRateCap(const uint16_t* src, size_t len, uint64_t total, size_t step, uint64_t* step_sums,
                  uint64_t* all_rates) {
  int rate_cap = kDefaultRateCap;
  const int largest = SumRates(src, len, rate_cap, step, step_sums, all_rates);
  if (largest <= rate_cap) return kMaxRateLog;  // the cap changes no rate: left out
  // An element at rate 2^(L/4) changes about once a step. In a chunk so sparse that this
  // level is near the default cap, the cap moves to two octaves above it.
  const int level = (Log2Q4(*all_rates) - Log2Q4(total)) / 4;
  if (level + 2 > rate_cap) {
    rate_cap = level + 2 >= largest ? kMaxRateLog : level + 2;
    SumRates(src, len, rate_cap, step, step_sums, all_rates);
  }
  return rate_cap;
}

// Changes and rate sums per history class (all in class 0 without history). The changes
// of classes 1 and 2 stay uncounted: only classes 0 and 3 set the boost.
struct HistoryTallies {
  uint64_t changes[kHistoryClasses] = {};
  uint64_t rate_sums[kHistoryClasses] = {};
  uint64_t recent_elements = 0;
  std::vector<uint32_t> bisected;  // with a history: the changes left to the bisection
};

// Fills `t` (which holds the chunk's totals in class 0) from a session history.
void TallyHistoryClasses(const uint16_t* src, const uint8_t* history, size_t len, int rate_cap,
                         const std::vector<uint32_t>& changed, HistoryTallies& t) {
  const uint64_t all_rates = t.rate_sums[0];
  // Elements with a recorded change are a minority: skip the others 8 at a time.
  constexpr uint64_t kAges = 0x0101010101010101ull * kHistoryAgeMask;
  size_t i = 0;
  while (i < len) {
    uint64_t word = 0;
    if (i + 8 <= len) std::memcpy(&word, history + i, 8);
    if (i + 8 <= len && (word & kAges) == 0) {
      i += 8;
    } else {
      t.rate_sums[HistoryClass(history[i])] += CappedRate(src[i], rate_cap);
      t.recent_elements += IsRecent(history[i]);
      ++i;
    }
  }
  t.rate_sums[0] = all_rates - t.rate_sums[1] - t.rate_sums[2] - t.rate_sums[3];
  t.changes[0] = 0;
  t.bisected.reserve(changed.size());
  for (const uint32_t position : changed) {
    if (IsRecent(history[position])) continue;
    ++t.changes[HistoryClass(history[position])];
    t.bisected.push_back(position);
  }
}

// L, the chunk's rate prior (see the top of this file), for the changes the bisection
// codes: with a history, those not recent, and the recent elements at rate 1 each.
int RatePriorOf(const HistoryTallies& t, uint8_t boost, bool with_history, uint64_t total) {
  // Only the prior uses this sum: saturate rather than overflow.
  const uint64_t limit = uint64_t{1} << 60;
  uint64_t rate_sum =
      t.rate_sums[0] + (t.rate_sums[3] >= (limit >> boost) ? limit : t.rate_sums[3] << boost);
  if (with_history) rate_sum += t.recent_elements;  // never 0 in all
  const uint64_t bisected_total = with_history ? t.bisected.size() : total;
  // rate_sum >= len >= changes, so L >= 0 up to the Log2Q4 rounding; <= 4 * 62.
  return std::min(std::max(Log2Q4(rate_sum) - Log2Q4(std::max<uint64_t>(bisected_total, 1)), 0),
                  255);
}

// The chunk header's fields (see the top of this file).
struct ModelledHeader {
  int log2_block;
  bool with_history;
  bool carried;
  uint32_t sign_period;  // 0: no column signs
  int rate_cap;          // kMaxRateLog: uncapped
  int rate_prior;        // L
  uint8_t boost;

  void AppendTo(std::vector<uint8_t>* out) const {
    out->push_back(static_cast<uint8_t>(
        (log2_block - kMinModelBlockLog) | (with_history ? kModelHistory : 0) |
        (carried ? kModelCarried : 0) | (sign_period != 0 ? kModelColumnSigns : 0) |
        (rate_cap < kMaxRateLog ? kModelRateCap : 0) | kModelValuePriors));
    out->push_back(static_cast<uint8_t>(rate_prior));
    if (with_history) out->push_back(boost);
    if (sign_period != 0) {
      out->push_back(static_cast<uint8_t>(sign_period));
      out->push_back(static_cast<uint8_t>(sign_period >> 8));
    }
    if (rate_cap < kMaxRateLog) out->push_back(static_cast<uint8_t>(rate_cap));
  }
};

// log2_block < 0: chosen from the density. Bytes: see the top of this file.
Status EncodeChunk(const uint16_t* src, const uint16_t* dst, size_t len, int log2_block,
                   std::vector<uint8_t>* out, const uint8_t* history, uint64_t counted,
                   const CarriedModel& carried, const std::vector<uint32_t>* sign_periods) {
  if (out == nullptr || (len > 0 && (src == nullptr || dst == nullptr))) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkModelled: null pointer");
  }
  if (len > kMaxModelledChunk) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkModelled: chunk too large");
  }
  if (log2_block >= 0 && (log2_block < kMinModelBlockLog || log2_block > kMaxModelBlockLog)) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkModelled: bad block size");
  }
  const uint64_t total = counted != kUncounted ? counted : ClassifyChanges(src, dst, len).changed;
  if (total == 0) return Status::Ok();  // the empty chunk
  std::vector<uint32_t> changed(total);
  std::vector<uint16_t> unused_xors(total);
  CompactChanges(src, dst, len, changed.data(), unused_xors.data());
  const bool choose_block = log2_block < 0;
  if (choose_block) log2_block = ChooseBlockLog(total, len);
  // Sparse chunks (blocks of 32+ elements) coded without a history keep their blocks' rate
  // sums for the coding pass, in a buffer each thread reuses (256 KB for the frame's
  // 2^20-element chunks); for smaller blocks such a buffer outgrows the caches and summing
  // again is cheaper, and a history changes the coding pass's rates.
  constexpr int kKeepBlockSumsLog = 5;
  thread_local std::vector<uint64_t> block_sums;
  const bool keep_block_sums = log2_block >= kKeepBlockSumsLog && history == nullptr;
  const size_t step = keep_block_sums ? size_t{1} << log2_block : kRateWindow;
  if (keep_block_sums && block_sums.size() < (len + step - 1) / step) {
    block_sums.resize((len + step - 1) / step);
  }
  uint64_t* const step_sums = keep_block_sums ? block_sums.data() : nullptr;
  uint64_t all_rates = 0;
  const int rate_cap = ChooseRateCap(src, len, total, step, step_sums, &all_rates);
  HistoryTallies tallies;
  tallies.changes[0] = total;
  tallies.rate_sums[0] = all_rates;
  if (history != nullptr) TallyHistoryClasses(src, history, len, rate_cap, changed, tallies);
  // A history without recorded changes (a session's first step) is not worth its bytes.
  if ((tallies.rate_sums[1] | tallies.rate_sums[2] | tallies.rate_sums[3]) == 0) {
    history = nullptr;
  }
  // With a history the recent elements (classes 1 and 2) are coded first (CodeRecent), and
  // the bisection codes the rest: class 0 and class 3 with its boost.
  const uint8_t boost = history != nullptr ? EstimateBoost(tallies.changes[3], tallies.rate_sums[3],
                                                           tallies.changes[0], tallies.rate_sums[0])
                                           : 0;
  if (history != nullptr && choose_block) log2_block = ChooseBlockLog(tallies.bisected.size(), len);
  const ModelledHeader header = {
      log2_block,
      history != nullptr,
      carried.start != nullptr,
      sign_periods != nullptr ? ChooseSignPeriod(src, dst, changed, history, *sign_periods) : 0,
      rate_cap,
      RatePriorOf(tallies, boost, history != nullptr, total),
      boost};
  header.AppendTo(out);
  EncoderIo io(src, dst, history != nullptr ? &tallies.bisected : &changed, out);
  if (history == nullptr) {
    PlainRates rates(src, len, rate_cap);
    CodeChunk(src, rates, len, log2_block, header.rate_prior, /*value_priors=*/true,
              header.sign_period, carried, &io, step_sums);
  } else {
    const int8_t boosts[kHistoryClasses] = {0, kRecentBoost, kRecentBoost,
                                            static_cast<int8_t>(boost)};
    HistoryRates rates(src, history, len, boosts, rate_cap);
    CodeChunk(src, rates, len, log2_block, header.rate_prior, /*value_priors=*/true,
              header.sign_period, carried, &io, /*block_sums=*/nullptr, history);
  }
  io.Finish();
  return Status::Ok();
}

}  // namespace

Status EncodeChunkModelledWithBlock(const uint16_t* src, const uint16_t* dst, size_t len,
                                    int log2_block, std::vector<uint8_t>* out,
                                    const uint8_t* history) {
  if (log2_block < 0) {
    return Status(ErrorCode::kInvalidArgument, "EncodeChunkModelled: bad block size");
  }
  return EncodeChunk(src, dst, len, log2_block, out, history, kUncounted, CarriedModel(), nullptr);
}

Status EncodeChunkModelled(const uint16_t* src, const uint16_t* dst, size_t len,
                           std::vector<uint8_t>* out, const uint8_t* history, uint64_t changes,
                           const CarriedModel& carried, const std::vector<uint32_t>* sign_periods) {
  return EncodeChunk(src, dst, len, -1, out, history, changes, carried, sign_periods);
}

std::vector<uint32_t> SignPeriodCandidates(uint64_t elements) {
  constexpr uint64_t kMaxPeriod = 65535;
  // Divisors up to kMaxPeriod from the prime factors up to it, by trial division.
  std::vector<uint64_t> divisors = {1};
  uint64_t rest = elements;
  const auto multiply_in = [&](uint64_t prime, int power) {
    const size_t known = divisors.size();
    for (size_t i = 0; i < known; ++i) {
      uint64_t d = divisors[i];
      for (int e = 0; e < power && d * prime <= kMaxPeriod; ++e) {
        d *= prime;
        divisors.push_back(d);
      }
    }
  };
  for (uint64_t prime = 2; prime <= kMaxPeriod && prime * prime <= rest; ++prime) {
    int power = 0;
    while (rest % prime == 0) {
      rest /= prime;
      ++power;
    }
    if (power > 0) multiply_in(prime, power);
  }
  if (rest > 1 && rest <= kMaxPeriod) multiply_in(rest, 1);  // the last prime factor
  std::vector<uint32_t> periods;
  for (const uint64_t d : divisors) {
    if (d < elements && (d == 1 || d >= 8)) periods.push_back(static_cast<uint32_t>(d));
  }
  std::sort(periods.begin(), periods.end());
  return periods;
}

Status DecodeChunkModelled(const uint16_t* src, size_t len, const uint8_t* bytes, size_t size,
                           std::vector<uint32_t>* positions, std::vector<uint16_t>* xors,
                           const uint8_t* history, const CarriedModel& carried) {
  if (positions == nullptr || xors == nullptr || (len > 0 && src == nullptr) ||
      (size > 0 && bytes == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "DecodeChunkModelled: null pointer");
  }
  if (len > kMaxModelledChunk) {
    return Status(ErrorCode::kInvalidArgument, "DecodeChunkModelled: chunk too large");
  }
  positions->clear();
  xors->clear();
  if (size == 0) return Status::Ok();  // nothing changed
  const uint8_t layout = bytes[0];
  const int log2_block = (layout & kBlockLogMask) + kMinModelBlockLog;
  if (log2_block > kMaxModelBlockLog) {
    return Status(ErrorCode::kCorruptChunk, "modelled chunk: bad block size");
  }
  if (len == 0) return Status(ErrorCode::kCorruptChunk, "modelled chunk: changes in 0 elements");
  const bool with_history = (layout & kModelHistory) != 0;
  const bool value_priors = (layout & kModelValuePriors) != 0;
  // The carried model replaces the priors; without it the chunk cannot be decoded.
  const bool from_carried = (layout & kModelCarried) != 0;
  if (from_carried && carried.start == nullptr) {
    return Status(ErrorCode::kCorruptChunk,
                  "modelled chunk: coded from a session's carried model, which the decoder "
                  "does not have");
  }
  const CarriedModel model_io{from_carried ? carried.start : nullptr, carried.end};
  const bool column_signs = (layout & kModelColumnSigns) != 0;
  const bool capped = (layout & kModelRateCap) != 0;
  const size_t period_at = with_history ? 3 : 2;
  const size_t cap_at = period_at + (column_signs ? 2 : 0);
  const size_t header = cap_at + (capped ? 1 : 0);
  if (size < header) return Status(ErrorCode::kTruncated, "modelled chunk: header truncated");
  const int rate_cap = capped ? bytes[cap_at] : kMaxRateLog;
  if (rate_cap > kMaxRateLog) {
    return Status(ErrorCode::kCorruptChunk, "modelled chunk: rate cap above 32");
  }
  const int L = bytes[1];
  const uint32_t sign_period =
      column_signs ? bytes[period_at] | static_cast<uint32_t>(bytes[period_at + 1]) << 8 : 0;
  if (column_signs && sign_period == 0) {
    return Status(ErrorCode::kCorruptChunk, "modelled chunk: sign period 0");
  }
  DecoderIo io(bytes + header, bytes + size, positions, xors);
  if (with_history) {
    if (history == nullptr) {
      return Status(ErrorCode::kCorruptChunk, "modelled chunk: coded with a session history");
    }
    const uint8_t last_boost = bytes[2];
    if (last_boost > 15) return Status(ErrorCode::kCorruptChunk, "modelled chunk: bad boost");
    const int8_t boosts[kHistoryClasses] = {0, kRecentBoost, kRecentBoost,
                                            static_cast<int8_t>(last_boost)};
    HistoryRates rates(src, history, len, boosts, rate_cap);
    CodeChunk(src, rates, len, log2_block, L, value_priors, sign_period, model_io, &io,
              /*block_sums=*/nullptr, history);
    if (!io.MergeRecent(history)) {
      positions->clear();
      xors->clear();
      return Status(ErrorCode::kCorruptChunk,
                    "modelled chunk: a change placed on a recently changed element");
    }
  } else {
    PlainRates rates(src, len, rate_cap);
    CodeChunk(src, rates, len, log2_block, L, value_priors, sign_period, model_io, &io);
  }
  // The encoder never ends a stream with a zero byte, and never codes a chunk without
  // changes.
  if (!io.coder().Valid() || (size > header && bytes[size - 1] == 0) || positions->empty()) {
    positions->clear();
    xors->clear();
    return Status(ErrorCode::kCorruptChunk, "modelled chunk: inconsistent range-coded stream");
  }
  return Status::Ok();
}

}  // namespace arc_v3

// The driver's payload cases for tests/from_spec (README.md there defines the case
// directory).
//
//   make_cases OUT    writes OUT/payloads/<name>/case.json and the files it names
//
// Every payload is made with the library, and every step's `expect` (and dst) is what the
// library's own decoder says of it, so the cases pin the library's behaviour, not a guess
// of it. Output is deterministic: fixed seeds (each scenario's from its name), and payload
// bytes do not depend on threads or SIMD target (arc_v3.hpp).
//
// A coverage summary (frame flags, chunk modes, layout bits, stream codecs, error names)
// goes to stderr, read from the payloads' own chunk headers and cross-checked with
// delta_stats. The run fails when a feature the cases must cover is missing, so that an
// encoder change that stops writing it is noticed here rather than silently untested.
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3.hpp"

namespace {

using arc_v3::Delta;
using arc_v3::Format;
using arc_v3::Options;
using arc_v3::Session;
using arc_v3::Status;
using Values = std::vector<uint16_t>;
using Bytes = std::vector<uint8_t>;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "make_cases: %s\n", message.c_str());
  std::exit(1);
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

//------------------------------------------------------------------------------
// Deterministic data

// splitmix64: the same numbers on every machine and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(((Next() >> 32) * n) >> 32); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  bool Chance(double p) { return p >= 1.0 || Uniform() < p; }
  double Normal() {  // Box-Muller
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// FNV-1a: seeds from names, so a scenario's data do not depend on what else is generated.
uint64_t Seed(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  return h;
}

// float -> BF16, round to nearest even (a NaN becomes the quiet NaN 0x7FC0).
uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FloatOf(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The monotone key of FORMAT.md ("Modelled chunk"): value order, +-0 neighbours.
uint16_t Key(uint16_t b) {
  return (b & 0x8000) ? static_cast<uint16_t>(0x7FFF - (b & 0x7FFF))
                      : static_cast<uint16_t>(b | 0x8000);
}
uint16_t FromKey(uint16_t k) {
  return (k & 0x8000) ? static_cast<uint16_t>(k & 0x7FFF)
                      : static_cast<uint16_t>(0x8000 | (0x7FFF - k));
}
// dst = src moved by d in key order, mod 2^16.
uint16_t MoveKey(uint16_t b, int d) { return FromKey(static_cast<uint16_t>(Key(b) + d)); }

// Bit patterns a decoder must carry through untouched.
constexpr uint16_t kSpecials[] = {
    0x7FC0, 0xFFC0, 0x7FC1, 0x7F81, 0xFFFF, 0x7FFF,  // quiet / signalling NaNs, payloads
    0x7F80, 0xFF80,                                  // +-Inf
    0x0000, 0x8000,                                  // +-0
    0x0001, 0x007F, 0x8001, 0x807F,                  // denormals
    0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80,          // smallest normal, +-max, +-1
};

enum class Base {
  kNormal,    // N(0, 0.02) rounded to BF16: a transformer's weights
  kZeros,     // all +0
  kDenormal,  // exponent 0, random mantissa and sign
  kHuge,      // exponents 240..254
  kRandom,    // every bit pattern (NaNs, Inf included)
  kTiny,      // N(0, 1e-6): exponents far below 127 (rates past the modelled coder's cap)
  kMixed,     // N(0, 0.02) with 2% special patterns
};
const char* BaseName(Base b) {
  switch (b) {
    case Base::kNormal: return "normal";
    case Base::kZeros: return "zeros";
    case Base::kDenormal: return "denormal";
    case Base::kHuge: return "huge";
    case Base::kRandom: return "random";
    case Base::kTiny: return "tiny";
    case Base::kMixed: return "mixed";
  }
  return "?";
}

Values MakeBase(Base kind, size_t n, Rng& rng) {
  Values v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (kind) {
      case Base::kNormal: v[i] = Bf16(static_cast<float>(0.02 * rng.Normal())); break;
      case Base::kZeros: v[i] = 0; break;
      case Base::kDenormal:
        v[i] = static_cast<uint16_t>((rng.Below(2) << 15) | rng.Below(128));
        break;
      case Base::kHuge:
        v[i] = static_cast<uint16_t>((rng.Below(2) << 15) | ((240 + rng.Below(15)) << 7) |
                                     rng.Below(128));
        break;
      case Base::kRandom: v[i] = static_cast<uint16_t>(rng.Next()); break;
      case Base::kTiny: v[i] = Bf16(static_cast<float>(1e-6 * rng.Normal())); break;
      case Base::kMixed:
        v[i] = rng.Chance(0.02) ? kSpecials[rng.Below(sizeof(kSpecials) / 2)]
                                : Bf16(static_cast<float>(0.02 * rng.Normal()));
        break;
    }
  }
  return v;
}

enum class Update {
  kUlp,      // key steps, mostly +-1, a few up to +-1023 (escapes)
  kWild,     // a random new bit pattern: sign and exponent changes, NaNs
  kSpecial,  // to a special pattern (NaN payloads, +-Inf, denormals, +-0)
  kJump,     // |key difference| >= 2^15 - 2^11: the key arithmetic wraps mod 2^16
  kColumns,  // a matrix whose columns share their update's sign (column signs)
  kPatchy,   // kUlp in one region of 2048 elements out of three (unchanged chunks)
  kAdam,     // w + N(0, sigma) for every element, rounded: `density` is sigma
};
const char* UpdateName(Update u) {
  switch (u) {
    case Update::kUlp: return "ulp";
    case Update::kWild: return "wild";
    case Update::kSpecial: return "special";
    case Update::kJump: return "jump";
    case Update::kColumns: return "columns";
    case Update::kPatchy: return "patchy";
    case Update::kAdam: return "adam";
  }
  return "?";
}

int SmallStep(Rng& rng) {
  const double r = rng.Uniform();
  const int size = r < 0.75   ? 1
                   : r < 0.9  ? 2 + static_cast<int>(rng.Below(2))
                   : r < 0.98 ? 4 + static_cast<int>(rng.Below(28))
                              : 32 + static_cast<int>(rng.Below(992));
  return rng.Below(2) ? size : -size;
}

// dst from src: `density` of the elements changed (every one at 1), by `kind`. `row`: the
// row length of kColumns.
Values MakeNext(const Values& src, Update kind, double density, size_t row, Rng& rng) {
  Values dst = src;
  std::vector<int> column_sign;
  if (kind == Update::kColumns) {
    column_sign.resize(row);
    for (int& s : column_sign) s = rng.Below(2) ? 1 : -1;
  }
  for (size_t i = 0; i < src.size(); ++i) {
    if (kind == Update::kAdam) {
      dst[i] = Bf16(FloatOf(src[i]) + static_cast<float>(density * rng.Normal()));
      continue;
    }
    if (kind == Update::kPatchy && (i >> 11) % 3 != 1) continue;
    if (density <= 0 || !rng.Chance(density)) continue;
    switch (kind) {
      case Update::kUlp:
      case Update::kPatchy:
      case Update::kAdam: dst[i] = MoveKey(src[i], SmallStep(rng)); break;
      case Update::kWild:
        do dst[i] = static_cast<uint16_t>(rng.Next());
        while (dst[i] == src[i]);
        break;
      case Update::kSpecial: {
        size_t k = rng.Below(sizeof(kSpecials) / 2);
        while (kSpecials[k] == src[i]) k = (k + 1) % (sizeof(kSpecials) / 2);
        dst[i] = kSpecials[k];
        break;
      }
      case Update::kJump: {
        const int size = 32768 - static_cast<int>(rng.Below(2048));  // 32768 included
        dst[i] = MoveKey(src[i], rng.Below(2) ? size : -size);
        break;
      }
      case Update::kColumns: {
        const int sign = column_sign[i % row] * (rng.Chance(0.1) ? -1 : 1);
        dst[i] = MoveKey(src[i], sign * (rng.Chance(0.8) ? 1 : 2));
        break;
      }
    }
  }
  return dst;
}

// A training run: states w_0 .. w_steps, step t with density[t] (the last entry for
// later steps; 0: nothing changes). Each step changes about that share of the elements:
// half of those the last step changed (mostly back, as a weight that just crossed a
// rounding boundary does), and fresh ones; so a session's history pays.
std::vector<Values> MakeRun(const Values& base, int steps, std::vector<double> density, Rng& rng) {
  std::vector<Values> run = {base};
  std::vector<int8_t> last(base.size(), 0);  // direction of the last step's change, 0: none
  for (int t = 0; t < steps; ++t) {
    const double p = density[std::min<size_t>(t, density.size() - 1)];
    Values next = run.back();
    std::vector<int8_t> now(base.size(), 0);
    for (size_t i = 0; i < next.size() && p > 0; ++i) {
      int d = 0;
      if (last[i] != 0 && rng.Chance(std::min(0.5, 4 * p))) {
        d = rng.Chance(0.7) ? -last[i] : last[i];
      } else if (rng.Chance(p / 2)) {
        d = SmallStep(rng);
      }
      if (d == 0) continue;
      next[i] = MoveKey(next[i], d);
      now[i] = static_cast<int8_t>(d > 0 ? 1 : -1);
    }
    last = now;
    run.push_back(std::move(next));
  }
  return run;
}

//------------------------------------------------------------------------------
// Cases

struct Step {
  Bytes payload;
  Values src;
  std::optional<std::vector<size_t>> counts;  // nullopt: a one-tensor decoder call
  uint64_t checksum = 0;
  bool reset = false;  // reset the session before this step
  std::string note;    // what the step is (extra field: check.py may print it)
  // Filled by the judge:
  std::string expect;
  Values dst;
};

struct Case {
  std::string name, note;
  bool session = false;
  std::vector<Step> steps;
};

std::vector<Case> g_cases;
std::set<std::string> g_names;
// Damaged steps the library accepted (benign damage), not recorded: by kind of damage.
std::map<std::string, uint64_t> g_dropped;

// Decodes `step` as check.py will: with `session` (the state of the steps before) or
// statelessly. `out` receives the result.
Status Decode(Session* session, const Step& step, Values* out) {
  out->assign(step.src.size(), 0xDEAD);
  if (!step.counts) {
    return session != nullptr
               ? session->Decompress(step.src.data(), step.src.size(), step.payload.data(),
                                     step.payload.size(), step.checksum, out->data())
               : arc_v3::delta_decompress(step.src.data(), step.src.size(), step.payload.data(),
                                          step.payload.size(), step.checksum, out->data());
  }
  std::vector<arc_v3::TensorOut> tensors;
  size_t offset = 0;
  for (const size_t count : *step.counts) {
    if (offset + count > step.src.size()) Die("counts exceed src in a step: " + step.note);
    tensors.push_back({step.src.data() + offset, out->data() + offset, count});
    offset += count;
  }
  if (offset != step.src.size()) Die("counts do not add up to src in a step: " + step.note);
  return session != nullptr
             ? session->DecompressTensors(tensors.data(), tensors.size(), step.payload.data(),
                                          step.payload.size(), step.checksum)
             : arc_v3::delta_decompress_tensors(tensors.data(), tensors.size(), step.payload.data(),
                                                step.payload.size(), step.checksum);
}

// Builds one case step by step, judging each step with the library's decoder in the
// state the steps before it left (a failed step leaves a session's state unchanged).
class CaseBuilder {
 public:
  CaseBuilder(std::string name, std::string note, bool session) {
    case_.name = std::move(name);
    case_.note = std::move(note);
    case_.session = session;
    if (session) receiver_ = std::make_unique<Session>();
  }

  // A step that must decode to `want` (a library bug otherwise: the run fails).
  void Valid(Step step, const Values& want) {
    Judge(&step);
    if (step.expect != "ok" || step.dst != want) {
      Die(case_.name + ": a valid step (" + step.note + ") decodes to " + step.expect +
          (step.expect == "ok" ? " with another result" : ""));
    }
    case_.steps.push_back(std::move(step));
  }
  // A step the library should refuse: recorded with the error it reports, or dropped
  // (returns false) where the library accepts it (damage that changes nothing).
  bool Damaged(Step step) {
    Judge(&step);
    if (step.expect == "ok") {
      // The kind: the note up to its first digit ("bit 3 of byte 7 flipped" -> "bit").
      ++g_dropped[step.note.substr(0, step.note.find_first_of("0123456789")) + "..."];
      if (receiver_) Replay();  // the accepted step advanced the state: undo it
      return false;
    }
    step.dst.clear();
    case_.steps.push_back(std::move(step));
    return true;
  }
  void Finish() {
    if (!g_names.insert(case_.name).second) Die("duplicate case name " + case_.name);
    g_cases.push_back(std::move(case_));
  }

 private:
  void Judge(Step* step) {
    if (receiver_ && step->reset) receiver_->Reset();
    const Status s = Decode(receiver_.get(), *step, &step->dst);
    step->expect = s.ok() ? "ok" : arc_v3::ErrorName(s.code());
  }
  // Rebuilds the receiver from the recorded steps (only resets and accepted steps change
  // it).
  void Replay() {
    receiver_ = std::make_unique<Session>();
    Values out;
    for (const Step& step : case_.steps) {
      if (step.reset) receiver_->Reset();
      if (step.expect == "ok") {
        Check(Decode(receiver_.get(), step, &out), "replaying " + case_.name);
      }
    }
  }

  Case case_;
  std::unique_ptr<Session> receiver_;
};

struct Config {
  const char* name;
  Format format;
  int effort;
};
constexpr Config kV1[] = {{"v1-e0", Format::kPublished, 0},
                          {"v1-e1", Format::kPublished, 1},
                          {"v1-e2", Format::kPublished, 2},
                          {"v1-e3", Format::kPublished, 3}};
constexpr Config kV16[] = {{"v16-e0", Format::kDefault, 0},
                           {"v16-e1", Format::kDefault, 1},
                           {"v16-e2", Format::kDefault, 2},
                           {"v16-e3", Format::kDefault, 3}};

Options OptionsOf(const Config& config, uint32_t chunk) {
  Options o;
  o.format = config.format;
  o.effort = config.effort;
  if (chunk != 0) o.chunk_elements = chunk;
  return o;
}

std::string ChunkTag(uint32_t chunk) { return chunk == 0 ? "" : "-c" + std::to_string(chunk); }

// A stateless one-tensor step.
Step Compress(const Values& src, const Values& dst, const Options& options,
              const std::string& note) {
  Delta delta;
  Check(arc_v3::delta_compress(src.data(), dst.data(), src.size(), &delta, options), note);
  if (delta.checksum != arc_v3::Checksum(dst.data(), dst.size())) Die(note + ": checksum differs");
  Step step;
  step.payload = std::move(delta.bytes);
  step.src = src;
  step.checksum = delta.checksum;
  step.note = note;
  return step;
}

std::vector<arc_v3::TensorDelta> TensorList(const Values& src, const Values& dst,
                                            const std::vector<size_t>& counts) {
  std::vector<arc_v3::TensorDelta> list;
  size_t offset = 0;
  for (const size_t c : counts) {
    list.push_back({src.data() + offset, dst.data() + offset, c});
    offset += c;
  }
  return list;
}

// A stateless several-tensor step (src and dst: the concatenations).
Step CompressTensors(const Values& src, const Values& dst, const std::vector<size_t>& counts,
                     const Options& options, const std::string& note) {
  Delta delta;
  const auto list = TensorList(src, dst, counts);
  Check(arc_v3::delta_compress_tensors(list.data(), list.size(), &delta, options), note);
  Step step;
  step.payload = std::move(delta.bytes);
  step.src = src;
  step.counts = counts;
  step.checksum = delta.checksum;
  step.note = note;
  return step;
}

// A session step; counts: CompressTensors with them, else Compress.
Step CompressSession(Session* sender, const Values& src, const Values& dst,
                     const std::optional<std::vector<size_t>>& counts, const std::string& note) {
  Delta delta;
  if (counts) {
    const auto list = TensorList(src, dst, *counts);
    Check(sender->CompressTensors(list.data(), list.size(), &delta), note);
  } else {
    Check(sender->Compress(src.data(), dst.data(), src.size(), &delta), note);
  }
  Step step;
  step.payload = std::move(delta.bytes);
  step.src = src;
  step.counts = counts;
  step.checksum = delta.checksum;
  step.note = note;
  return step;
}

std::string Fmt(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
}

//------------------------------------------------------------------------------
// The payload matrix: every format and effort over densities, bases and update kinds.

struct Scenario {
  Base base;
  Update update;
  double density;
  size_t n;
  uint32_t chunk;  // 0: the default
  size_t row;      // kColumns' row length
  const char* why;
  std::string Name() const {
    return std::string(BaseName(base)) + "-" + UpdateName(update) + "-d" + Fmt(density) + "-n" +
           std::to_string(n) + ChunkTag(chunk) + (row ? "-r" + std::to_string(row) : "");
  }
};

const std::vector<Scenario>& MatrixScenarios() {
  static const std::vector<Scenario> s = {
      {Base::kNormal, Update::kUlp, 0, 4096, 0, 0, "nothing changed"},
      {Base::kNormal, Update::kUlp, 0.002, 65536, 0, 0, "very sparse: gaps, modelled"},
      {Base::kNormal, Update::kUlp, 0.02, 32768, 4096, 0, "sparse, 8 chunks"},
      {Base::kNormal, Update::kUlp, 0.02, 131072, 0, 0,
       "2% of 2^17 in one chunk: rANS at effort 1-2"},
      {Base::kNormal, Update::kUlp, 0.1, 65536, 0, 0, "10%: rANS"},
      {Base::kNormal, Update::kUlp, 0.5, 16384, 4096, 0,
       "50% of 4096-element chunks: rANS or modelled by chunk"},
      {Base::kNormal, Update::kUlp, 1, 8192, 1024, 0, "every element changed, small chunks"},
      {Base::kNormal, Update::kUlp, 1, 16384, 4096, 0, "every element changed: rANS"},
      {Base::kNormal, Update::kAdam, 2e-4, 65536, 0, 0, "a realistic update (w + N(0, 2e-4))"},
      {Base::kNormal, Update::kAdam, 3e-5, 131072, 0, 0, "a realistic small update"},
      {Base::kNormal, Update::kWild, 0.1, 8192, 0, 0, "sign and exponent changes"},
      {Base::kMixed, Update::kSpecial, 0.05, 8192, 0, 0,
       "to and from NaN payloads, +-Inf, denormals, +-0"},
      {Base::kNormal, Update::kJump, 0.02, 16384, 0, 0, "|key difference| >= 2^15: wraps mod 2^16"},
      {Base::kNormal, Update::kJump, 0.5, 8192, 4096, 0,
       "dense jumps: rANS escapes of the largest class"},
      {Base::kZeros, Update::kUlp, 0.02, 8192, 0, 0, "an all-zero base"},
      {Base::kZeros, Update::kUlp, 0.6, 8192, 4096, 0, "an all-zero base, dense"},
      {Base::kDenormal, Update::kUlp, 0.05, 8192, 0, 0, "a denormal base"},
      {Base::kHuge, Update::kUlp, 0.05, 8192, 0, 0, "huge exponents"},
      {Base::kHuge, Update::kUlp, 0.6, 8192, 4096, 0, "huge exponents, dense"},
      {Base::kRandom, Update::kWild, 0.5, 8192, 0, 0, "every bit pattern"},
      {Base::kTiny, Update::kUlp, 0.05, 16384, 0, 0, "tiny weights: capped rates"},
      {Base::kTiny, Update::kUlp, 0.6, 8192, 4096, 0, "tiny weights, dense"},
      {Base::kNormal, Update::kColumns, 0.02, 65536, 0, 256, "column signs, one chunk"},
      {Base::kNormal, Update::kColumns, 0.1, 32768, 4096, 96,
       "column signs, rows of 96 across chunks"},
      {Base::kNormal, Update::kPatchy, 0.02, 65536, 1024, 0, "64 chunks, 2 in 3 unchanged"},
      {Base::kNormal, Update::kPatchy, 0.7, 65536, 4096, 0, "rANS chunks among unchanged ones"},
  };
  return s;
}

// One case per scenario, one step per format and effort (the steps share src and dst).
void MatrixCases() {
  for (const Scenario& sc : MatrixScenarios()) {
    Rng rng(Seed(sc.Name()));
    const Values src = MakeBase(sc.base, sc.n, rng);
    const Values dst = MakeNext(src, sc.update, sc.density, sc.row, rng);
    CaseBuilder b("formats-" + sc.Name(), std::string(sc.why) + "; one step per format and effort",
                  false);
    for (const auto* configs : {kV1, kV16}) {
      for (int e = 0; e < 4; ++e) {
        b.Valid(Compress(src, dst, OptionsOf(configs[e], sc.chunk), configs[e].name), dst);
      }
    }
    b.Finish();
  }
}

//------------------------------------------------------------------------------
// Element counts and chunk boundaries.

void EdgeCases() {
  const size_t counts[] = {0,    1,    2,    15,   16,   17,   1023, 1024,
                           1025, 1152, 1153, 2047, 2048, 2049, 3073, 4097};
  const Config configs[] = {kV1[0], kV1[2], kV16[0], kV16[2], kV16[3]};
  struct Kind {
    Base base;
    Update update;
    double density;
  };
  const Kind kinds[] = {{Base::kMixed, Update::kWild, 0.3},
                        {Base::kNormal, Update::kUlp, 1},
                        {Base::kNormal, Update::kUlp, 0.01}};
  for (const size_t n : counts) {
    for (const Kind& k : kinds) {
      const std::string tag = std::string(BaseName(k.base)) + "-" + UpdateName(k.update) + "-d" +
                              Fmt(k.density) + "-n" + std::to_string(n) + "-c1024";
      Rng rng(Seed(tag));
      const Values src = MakeBase(k.base, n, rng);
      const Values dst = MakeNext(src, k.update, k.density, 0, rng);
      CaseBuilder b("edge-" + tag,
                    "element count " + std::to_string(n) + " with 1024-element chunks", false);
      for (const Config& c : configs) {
        b.Valid(Compress(src, dst, OptionsOf(c, 1024), c.name), dst);
        // The same payload through the tensor-list decoder, as a list of one.
        Step as_list = Compress(src, dst, OptionsOf(c, 1024),
                                std::string(c.name) + ", as a list of one tensor");
        as_list.counts = std::vector<size_t>{n};
        b.Valid(std::move(as_list), dst);
      }
      b.Finish();
    }
  }
  // Chunk sizes at the ends of the range and the default, on one update.
  Rng rng(Seed("chunk-sizes"));
  const Values src = MakeBase(Base::kNormal, 40000, rng);
  const Values dst = MakeNext(src, Update::kUlp, 0.05, 0, rng);
  CaseBuilder b("chunks-normal-ulp-d0.05-n40000", "chunk sizes 2^10 .. 2^24 (short last chunks)",
                false);
  for (const uint32_t chunk : {1024u, 2048u, 4096u, 16384u, 32768u, 65536u, 1u << 24}) {
    for (const Config& c : {kV1[2], kV16[1], kV16[2]}) {
      b.Valid(Compress(src, dst, OptionsOf(c, chunk), std::string(c.name) + ChunkTag(chunk)), dst);
    }
  }
  b.Finish();
}

//------------------------------------------------------------------------------
// Several tensors in one payload.

void TensorCases() {
  struct List {
    const char* name;
    std::vector<size_t> counts;
    double density;
    uint32_t chunk;
    const char* why;
  };
  const List lists[] = {
      {"mixed6", {3000, 0, 17, 0, 5127, 1}, 0.03, 1024, "zero-element tensors among others"},
      {"one", {5000}, 0.05, 0, "one tensor through the tensor-list encoder (Tensors flag, K = 1)"},
      {"empty1", {0}, 0, 0, "one tensor of 0 elements"},
      {"none", {}, 0, 0, "no tensors at all (K = 0)"},
      {"zeros3", {0, 0, 0}, 0, 0, "three tensors of 0 elements"},
      {"dense3", {40000, 60000, 31072}, 0.1, 16384, "dense: rANS chunks across tensor boundaries"},
      {"norms8",
       {512, 512, 512, 512, 2048, 2048, 64, 64},
       0.2,
       1024,
       "small tensors, chunks across them"},
  };
  for (const List& l : lists) {
    size_t n = 0;
    for (const size_t c : l.counts) n += c;
    Rng rng(Seed(std::string("tensors-") + l.name));
    const Values src = MakeBase(Base::kNormal, n, rng);
    const Values dst = MakeNext(src, Update::kUlp, l.density, 0, rng);
    CaseBuilder b(std::string("tensors-") + l.name + "-n" + std::to_string(n) + ChunkTag(l.chunk),
                  std::string(l.why) + "; per effort: the payload, then wrong tensor lists", false);
    for (const Config& c : kV16) {
      const std::string at = std::string(c.name) + ": ";
      const Step good =
          CompressTensors(src, dst, l.counts, OptionsOf(c, l.chunk), at + "the payload");
      b.Valid(good, dst);
      Step one = good;  // a one-tensor decoder must refuse the Tensors flag
      one.counts.reset();
      one.note = at + "one-tensor decoder call (delta_decompress)";
      b.Damaged(std::move(one));
      if (l.counts.size() >= 2) {
        Step swapped = good;  // same total, another split
        std::swap((*swapped.counts)[0], (*swapped.counts)[1]);
        if (*swapped.counts != l.counts) {
          swapped.note = at + "the first two counts swapped";
          b.Damaged(std::move(swapped));
        }
        Step merged = good;  // the first two tensors as one
        (*merged.counts)[1] += (*merged.counts)[0];
        merged.counts->erase(merged.counts->begin());
        merged.note = at + "the first two tensors passed as one";
        b.Damaged(std::move(merged));
      }
      Step extra = good;  // one more tensor, of 0 elements
      extra.counts->push_back(0);
      extra.note = at + "an extra tensor of 0 elements";
      b.Damaged(std::move(extra));
      if (n > 0) {
        if (good.counts->back() > 0) {  // the last element moved to a tensor of its own
          Step moved = good;
          moved.counts->back() -= 1;
          moved.counts->push_back(1);
          moved.note = at + "the last element passed as a tensor of its own";
          b.Damaged(std::move(moved));
        }
        Step wrong = good;
        wrong.checksum ^= 1;
        wrong.note = at + "wrong checksum";
        b.Damaged(std::move(wrong));
      }
    }
    b.Finish();
  }
  // A one-tensor payload (delta_compress) handed to the tensor-list decoder: a list of one
  // matches it, a split of the same elements does not.
  Rng rng(Seed("tensors-plain"));
  const Values src = MakeBase(Base::kNormal, 6000, rng);
  const Values dst = MakeNext(src, Update::kUlp, 0.03, 0, rng);
  CaseBuilder b("tensors-plain-payload-n6000",
                "a one-tensor payload through the tensor-list decoder", false);
  for (const Config& c : {kV1[2], kV16[2]}) {
    const std::string at = std::string(c.name) + ": ";
    Step good = Compress(src, dst, OptionsOf(c, 0), at + "a list of one");
    good.counts = std::vector<size_t>{6000};
    b.Valid(good, dst);
    Step split = good;
    split.counts = std::vector<size_t>{2000, 4000};
    split.note = at + "split in two tensors";
    b.Damaged(std::move(split));
    Step with_zero = good;
    with_zero.counts = std::vector<size_t>{6000, 0};
    with_zero.note = at + "with a 0-element tensor after it";
    b.Damaged(std::move(with_zero));
  }
  b.Finish();
}

//------------------------------------------------------------------------------
// Sessions.

// The sessions of `configs` over `run` (states w_0..w_steps), each step decoded in order;
// the receiver resets between configs (so the steps share their files). counts:
// CompressTensors with that split.
void SessionRun(const std::string& name, const std::string& note, std::vector<Config> configs,
                uint32_t chunk, const std::vector<Values>& run,
                const std::optional<std::vector<size_t>>& counts) {
  CaseBuilder b(name, note + "; per effort, after a reset", true);
  for (size_t k = 0; k < configs.size(); ++k) {
    Session sender(OptionsOf(configs[k], chunk));
    for (size_t t = 0; t + 1 < run.size(); ++t) {
      Step step = CompressSession(&sender, run[t], run[t + 1], counts,
                                  std::string(configs[k].name) + " step " + std::to_string(t));
      step.reset = k > 0 && t == 0;
      b.Valid(std::move(step), run[t + 1]);
    }
  }
  b.Finish();
}

void SessionCases() {
  // Sparse runs: modelled chunks with the history and carried models.
  {
    Rng rng(Seed("session-sparse"));
    const auto run =
        MakeRun(MakeBase(Base::kNormal, 16384, rng), 8, {0.03, 0.03, 0.03, 0.03, 0, 0.03}, rng);
    SessionRun("session-sparse-normal-d0.03-n16384-c4096-s8",
               "8 steps, sparse (step 4 changes nothing): modelled chunks with the history, "
               "carried models",
               {kV16[0], kV16[1], kV16[2], kV16[3]}, 4096, run, std::nullopt);
  }
  // Dense runs: rANS chunks with the history (Chunk_Mode 4).
  {
    Rng rng(Seed("session-dense"));
    const auto run = MakeRun(MakeBase(Base::kNormal, 32768, rng), 7, {0.16}, rng);
    SessionRun("session-dense-normal-d0.16-n32768-c16384-s7",
               "7 steps, dense: rANS chunks with the history", {kV16[1], kV16[2], kV16[3]}, 16384,
               run, std::nullopt);
  }
  // Chunks that alternate between modelled and rANS (a carried model waits through rANS
  // steps) and a step that changes nothing.
  {
    Rng rng(Seed("session-alternating"));
    const auto run = MakeRun(MakeBase(Base::kNormal, 32768, rng), 8,
                             {0.02, 0.2, 0.02, 0, 0.2, 0.02, 0.2, 0.02}, rng);
    SessionRun("session-alternating-normal-n32768-c16384-s8",
               "densities 2%, 20%, 2%, 0, 20%, 2%, 20%, 2%: modelled and rANS steps by turns",
               {kV16[2], kV16[3]}, 16384, run, std::nullopt);
  }
  // Few elements: 0, 1 and 17 (a session over nothing still keeps its step).
  for (const size_t n : {size_t{0}, size_t{1}, size_t{17}}) {
    Rng rng(Seed("session-small-" + std::to_string(n)));
    const auto run = MakeRun(MakeBase(Base::kMixed, n, rng), 4, {1, 0, 0.5}, rng);
    SessionRun("session-small-n" + std::to_string(n) + "-s4",
               "a session over " + std::to_string(n) + " elements", {kV16[0], kV16[2]}, 0, run,
               std::nullopt);
    SessionRun("session-small-tensors-n" + std::to_string(n) + "-s4",
               "a session over tensors of 0 and " + std::to_string(n) + " elements", {kV16[2]}, 0,
               run, std::vector<size_t>{0, n});
  }
  // Tiny weights and columns: capped rates and column signs with the history.
  {
    Rng rng(Seed("session-tiny"));
    const auto run = MakeRun(MakeBase(Base::kTiny, 16384, rng), 6, {0.05}, rng);
    SessionRun("session-tiny-d0.05-n16384-s6", "capped rates with the history", {kV16[2]}, 0, run,
               std::nullopt);
  }
  {
    Rng rng(Seed("session-columns"));
    std::vector<Values> run = {MakeBase(Base::kNormal, 32768, rng)};
    for (int t = 0; t < 6; ++t) {
      run.push_back(MakeNext(run.back(), Update::kColumns, 0.03, 128, rng));
    }
    SessionRun("session-columns-d0.03-n32768-r128-s6", "column signs with the history", {kV16[2]},
               0, run, std::nullopt);
  }
  // Several tensors in one session (Session + Tensors, Continues with the Tensors flag).
  {
    const std::vector<size_t> counts = {5000, 0, 300, 11000, 1};
    Rng rng(Seed("session-tensors"));
    const auto run = MakeRun(MakeBase(Base::kNormal, 16301, rng), 7, {0.04}, rng);
    SessionRun("session-tensors5-n16301-c4096-s7",
               "a session over 5 tensors (two of 0 and 1 elements)", {kV16[0], kV16[2], kV16[3]},
               4096, run, counts);
  }

  // Errors and resets: a step out of order, repeated, from a wrong base, a reset on one
  // side; a failed step leaves the state unchanged and the next good one decodes.
  for (const bool tensors : {false, true}) {
    const std::optional<std::vector<size_t>> counts =
        tensors ? std::optional<std::vector<size_t>>(std::vector<size_t>{4000, 0, 4192})
                : std::nullopt;
    Rng rng(Seed(tensors ? "session-errors-tensors" : "session-errors"));
    const auto run = MakeRun(MakeBase(Base::kNormal, 8192, rng), 9, {0.04}, rng);
    Session sender(OptionsOf(kV16[2], 4096));
    std::vector<Step> p;  // p[t]: run[t] -> run[t + 1]
    for (int t = 0; t < 6; ++t) {
      // Step 4 starts a new history (the receiver must reset too).
      if (t == 4) sender.Reset();
      p.push_back(
          CompressSession(&sender, run[t], run[t + 1], counts, "step " + std::to_string(t)));
    }
    // Step 6 from step 4's result (not the last step's): names its base, no Continues.
    p.push_back(CompressSession(&sender, run[5], run[7], counts,
                                "step 6: run[5] -> run[7], not from the last result"));
    p.push_back(CompressSession(&sender, run[7], run[8], counts, "step 7"));
    if (tensors) {  // step 8 over another split of the same elements: names its tensors
      p.push_back(CompressSession(&sender, run[8], run[9], std::vector<size_t>{4000, 4192},
                                  "step 8: another tensor list (0-element tensor left out)"));
    } else {
      p.push_back(CompressSession(&sender, run[8], run[9], counts, "step 8"));
    }
    auto with = [](Step s, const std::string& note) {
      s.note = note;
      return s;
    };
    CaseBuilder b(std::string("session-errors") + (tensors ? "-tensors3" : "") + "-n8192-c4096",
                  "steps out of order, repeated, from a wrong base, a reset: errors leave the "
                  "state unchanged",
                  true);
    b.Valid(p[0], run[1]);
    b.Damaged(with(p[2], "step 2 before step 1 (base given right)"));
    {
      Step s = p[2];
      s.src = run[1];
      s.note = "step 2 before step 1, src = step 0's result";
      b.Damaged(std::move(s));
    }
    b.Valid(p[1], run[2]);
    b.Damaged(with(p[1], "step 1 again"));
    b.Damaged(with(p[0], "step 0 again"));
    {
      Step s = p[2];
      s.src = run[1];
      s.note = "step 2 with a wrong base (step 0's result)";
      b.Damaged(std::move(s));
    }
    {
      Step s = p[2];
      s.src[77] ^= 1;
      s.note = "step 2 with one element of its base changed";
      b.Damaged(std::move(s));
    }
    {
      Step s = p[2];
      s.checksum ^= 0x100;
      s.note = "step 2 with a wrong checksum";
      b.Damaged(std::move(s));
    }
    if (tensors) {
      Step s = p[2];
      s.counts = std::vector<size_t>{4000, 4192};
      s.note = "step 2 with other tensors";
      b.Damaged(std::move(s));
      Step t = p[2];
      t.counts.reset();
      t.note = "step 2 by a one-tensor call";
      b.Damaged(std::move(t));
      b.Valid(p[2], run[3]);
    } else {  // a one-tensor frame matches a list of one
      Step s = p[2];
      s.counts = std::vector<size_t>{8192};
      s.note = "step 2 by the tensor-list call (a list of one)";
      b.Valid(std::move(s), run[3]);
    }
    b.Valid(p[3], run[4]);
    b.Damaged(with(p[4], "step 4 (a new history) without the receiver's reset"));
    {
      Step s = p[5];
      s.reset = true;
      s.note = "reset, then step 5 (continues a step not decoded)";
      b.Damaged(std::move(s));
    }
    {
      Step s = p[4];
      s.note = "step 4 after the reset";
      b.Valid(std::move(s), run[5]);
    }
    b.Valid(p[5], run[6]);
    b.Damaged(with(p[7], "step 7 before step 6"));
    {
      Step s = p[6];
      s.src = run[6];
      s.note = "step 6 from the last result instead of its base";
      b.Damaged(std::move(s));
    }
    b.Valid(p[6], run[7]);
    b.Valid(p[7], run[8]);
    b.Valid(p[8], run[9]);
    b.Finish();
  }

  // Payload kinds at the wrong decoder: a session payload to a stateless decoder, a
  // stateless payload to a session.
  {
    Rng rng(Seed("session-crossed"));
    const Values src = MakeBase(Base::kNormal, 4096, rng);
    const Values dst = MakeNext(src, Update::kUlp, 0.05, 0, rng);
    Session sender;
    Step session_step = CompressSession(&sender, src, dst, std::nullopt, "a session's first step");
    CaseBuilder a("crossed-session-payload-stateless", "a session payload at a stateless decoder",
                  false);
    a.Damaged(session_step);
    a.Finish();
    CaseBuilder b("crossed-stateless-payload-session", "a stateless payload at a session", true);
    b.Damaged(Compress(src, dst, Options(), "delta_compress's payload"));
    b.Damaged(Compress(src, dst, OptionsOf(kV1[2], 0), "a version-1 payload"));
    b.Valid(session_step, dst);
    b.Finish();
  }
}

//------------------------------------------------------------------------------
// Corruption: damaged copies of valid payloads, with the error the library reports.

// Offsets of the frame header's fields, read from a valid payload.
struct HeaderLayout {
  size_t version = 4, flags = 5, count = 6, count_size = 0, chunk_log = 0;
};
HeaderLayout LayoutOf(const Bytes& p) {
  HeaderLayout h;
  size_t i = h.count;
  while (i < p.size() && (p[i] & 0x80)) ++i;
  h.count_size = i + 1 - h.count;
  h.chunk_log = i + 1;
  return h;
}

// "chunk modes: 2 x3, 4 x1": what delta_stats counts in a valid payload.
std::string ModesOf(const Bytes& payload) {
  arc_v3::PayloadStats stats;
  Check(arc_v3::delta_stats(payload.data(), payload.size(), &stats), "delta_stats");
  std::string s;
  for (int m = 0; m < 5; ++m) {
    if (stats.chunk_modes[m] == 0) continue;
    s += (s.empty() ? "chunk modes: " : ", ") + std::to_string(m) + " x" +
         std::to_string(stats.chunk_modes[m]);
  }
  return s.empty() ? "no chunks" : s;
}

// Adds the damaged variants of `good` (a valid step) to `b`.
void AddDamage(CaseBuilder* b, const Step& good, Rng& rng) {
  const Bytes& p = good.payload;
  const size_t size = p.size();
  auto variant = [&](Bytes bytes, const std::string& note) {
    Step s = good;
    s.payload = std::move(bytes);
    s.note = note;
    b->Damaged(std::move(s));
  };
  // Truncations: every length of a small payload, else a spread.
  std::set<size_t> lengths;
  if (size <= 400) {
    for (size_t l = 0; l < size; ++l) lengths.insert(l);
  } else {
    for (size_t l = 0; l < 32; ++l) lengths.insert(l);
    for (size_t k = 0; k < 24; ++k) lengths.insert(32 + (size - 40) * k / 24);
    for (size_t l = size - 8; l < size; ++l) lengths.insert(l);
  }
  for (const size_t l : lengths) {
    variant(Bytes(p.begin(), p.begin() + l), "truncated to " + std::to_string(l));
  }
  for (const uint8_t extra : {0x00, 0x01, 0xFF}) {
    Bytes longer = p;
    longer.push_back(extra);
    variant(longer, "one byte " + std::to_string(extra) + " appended");
  }
  // Single-bit flips: the first 32 bytes (headers), then a spread.
  std::set<std::pair<size_t, int>> flips;
  for (size_t i = 0; i < std::min<size_t>(size, 32); ++i) {
    flips.insert({i, static_cast<int>((i * 5 + 1) % 8)});
  }
  for (int k = 0; k < 40 && size > 32; ++k) {
    flips.insert(
        {32 + rng.Below(static_cast<uint32_t>(size - 32)), static_cast<int>(rng.Below(8))});
  }
  for (const auto& [at, bit] : flips) {
    Bytes q = p;
    q[at] ^= static_cast<uint8_t>(1u << bit);
    variant(q, "bit " + std::to_string(bit) + " of byte " + std::to_string(at) + " flipped");
  }
  // Byte edits.
  for (int k = 0; k < 24 && size > 0; ++k) {
    const size_t at = k < 8 ? rng.Below(static_cast<uint32_t>(std::min<size_t>(size, 32)))
                            : rng.Below(static_cast<uint32_t>(size));
    Bytes q = p;
    const uint8_t values[] = {0x00, 0xFF, static_cast<uint8_t>(p[at] + 1),
                              static_cast<uint8_t>(p[at] - 1)};
    q[at] = values[k % 4];
    if (q[at] == p[at]) continue;
    variant(q, "byte " + std::to_string(at) + " set to " + std::to_string(q[at]));
  }
  // The frame header's fields.
  if (size >= 8) {
    const HeaderLayout h = LayoutOf(p);
    {
      Bytes q = p;
      q[0] = 'X';
      variant(q, "magic 'XRC3'");
    }
    for (const uint8_t v : {0, 1, 2, 15, 16, 17, 255}) {
      if (v == p[h.version]) continue;
      Bytes q = p;
      q[h.version] = v;
      variant(q, "version " + std::to_string(v));
    }
    for (int bit = 0; bit < 8; ++bit) {
      Bytes q = p;
      q[h.flags] ^= static_cast<uint8_t>(1u << bit);
      variant(q, "flag bit " + std::to_string(bit) + " toggled");
    }
    if (h.chunk_log < size) {
      for (const int delta : {-1, 1}) {
        Bytes q = p;
        q[h.chunk_log] = static_cast<uint8_t>(q[h.chunk_log] + delta);
        variant(q, "chunk log " + std::to_string(q[h.chunk_log]));
      }
      for (const uint8_t v : {9, 25, 255}) {
        Bytes q = p;
        q[h.chunk_log] = v;
        variant(q, "chunk log " + std::to_string(v));
      }
      if (h.count_size == 1 && p[h.count] < 0x7F) {  // Element_Count + 1, and non-minimal
        Bytes q = p;
        q[h.count] += 1;
        variant(q, "element count + 1");
        Bytes r = p;
        r[h.count] |= 0x80;
        r.insert(r.begin() + static_cast<long>(h.count) + 1, 0x00);
        variant(r, "element count as a non-minimal varint");
      }
    }
  }
  // The wrong src or checksum.
  if (!good.src.empty()) {
    Step s = good;
    s.src[s.src.size() / 2] ^= 0x0001;
    s.note = "src with one element's lowest bit flipped";
    b->Damaged(std::move(s));
    Step t = good;
    for (uint16_t& v : t.src) v = MoveKey(v, 1);
    t.note = "src with every element moved one key up";
    b->Damaged(std::move(t));
  }
  {
    Step s = good;
    s.checksum ^= 1;
    s.note = "checksum with its lowest bit flipped";
    b->Damaged(std::move(s));
  }
  if (!good.counts) {
    Step s = good;
    s.src.push_back(0x3F80);
    s.note = "src one element longer";
    b->Damaged(std::move(s));
  }
}

void CorruptionCases() {
  struct Target {
    const char* name;
    Config config;
    Base base;
    Update update;
    double density;
    size_t n;
    uint32_t chunk;
    size_t row;
  };
  const Target targets[] = {
      {"xor-small", kV1[2], Base::kMixed, Update::kWild, 0.1, 300, 0, 0},
      {"xor-bitmap", kV1[0], Base::kNormal, Update::kUlp, 0.4, 2048, 0, 0},
      {"xor-zstd", kV1[3], Base::kNormal, Update::kUlp, 0.05, 4096, 0, 0},
      {"xor-chunks", kV1[2], Base::kNormal, Update::kPatchy, 0.05, 7000, 1024, 0},
      {"xor-small", kV16[0], Base::kMixed, Update::kWild, 0.1, 300, 0, 0},
      {"xor-bitmap", kV16[0], Base::kNormal, Update::kUlp, 0.4, 2048, 0, 0},
      {"xor-zstd", kV16[3], Base::kRandom, Update::kWild, 0.3, 1024, 0, 0},
      {"modelled-small", kV16[2], Base::kNormal, Update::kUlp, 0.05, 2000, 0, 0},
      {"modelled-wild", kV16[2], Base::kMixed, Update::kWild, 0.05, 4096, 0, 0},
      {"modelled-columns", kV16[2], Base::kNormal, Update::kColumns, 0.1, 4096, 0, 64},
      {"modelled-capped", kV16[2], Base::kTiny, Update::kUlp, 0.08, 4096, 0, 0},
      {"rans", kV16[2], Base::kNormal, Update::kUlp, 0.6, 4096, 0, 0},
      {"rans-specials", kV16[1], Base::kMixed, Update::kUlp, 0.6, 4096, 0, 0},
      {"chunks", kV16[2], Base::kNormal, Update::kPatchy, 0.5, 7000, 1024, 0},
  };
  for (const Target& t : targets) {
    const std::string tag = std::string(t.name) + "-" + BaseName(t.base) + "-" +
                            UpdateName(t.update) + "-d" + Fmt(t.density) + "-n" +
                            std::to_string(t.n) + ChunkTag(t.chunk);
    Rng rng(Seed(std::string(t.config.name) + tag));
    const Values src = MakeBase(t.base, t.n, rng);
    const Values dst = MakeNext(src, t.update, t.density, t.row, rng);
    const Step good = Compress(src, dst, OptionsOf(t.config, t.chunk), "the valid payload");
    CaseBuilder b("corrupt-" + std::string(t.config.name) + "-" + tag,
                  "truncations, bit flips, byte edits, header fields, wrong src and checksum (" +
                      ModesOf(good.payload) + ")",
                  false);
    b.Valid(good, dst);
    AddDamage(&b, good, rng);
    b.Finish();
  }
  // A tensor-list payload.
  {
    const std::vector<size_t> counts = {700, 0, 300, 1};
    Rng rng(Seed("corrupt-tensors"));
    const Values src = MakeBase(Base::kNormal, 1001, rng);
    const Values dst = MakeNext(src, Update::kUlp, 0.1, 0, rng);
    const Step good = CompressTensors(src, dst, counts, OptionsOf(kV16[2], 0), "the valid payload");
    CaseBuilder b("corrupt-v16-e2-tensors4-n1001",
                  "a damaged tensor-list payload (" + ModesOf(good.payload) + ")", false);
    b.Valid(good, dst);
    AddDamage(&b, good, rng);
    b.Finish();
  }
  // Session steps: damaged copies of step k after steps 0..k-1, then step k and k+1 (the
  // failures left the state unchanged).
  struct SessionTarget {
    const char* name;
    double density;
    size_t n;
    uint32_t chunk;
    int step;
    std::optional<std::vector<size_t>> counts;
  };
  const SessionTarget session_targets[] = {
      {"modelled-carried", 0.04, 4096, 0, 2, std::nullopt},
      {"rans-history", 0.3, 16384, 0, 3, std::nullopt},
      {"tensors", 0.05, 3000, 1024, 2, std::vector<size_t>{1000, 0, 2000}},
      {"first-step", 0.05, 2048, 0, 0, std::nullopt},
  };
  for (const SessionTarget& t : session_targets) {
    const std::string name = std::string("corrupt-session-v16-e2-") + t.name + "-n" +
                             std::to_string(t.n) + "-step" + std::to_string(t.step);
    Rng rng(Seed(name));
    const auto run = MakeRun(MakeBase(Base::kNormal, t.n, rng), t.step + 2, {t.density}, rng);
    Session sender(OptionsOf(kV16[2], t.chunk));
    std::vector<Step> p;
    for (int s = 0; s <= t.step + 1; ++s) {
      p.push_back(
          CompressSession(&sender, run[s], run[s + 1], t.counts, "step " + std::to_string(s)));
    }
    CaseBuilder b(name,
                  "damaged copies of step " + std::to_string(t.step) +
                      "; the state stays as it was (" + ModesOf(p[t.step].payload) + ")",
                  true);
    for (int s = 0; s < t.step; ++s) b.Valid(p[s], run[s + 1]);
    AddDamage(&b, p[t.step], rng);
    b.Valid(p[t.step], run[t.step + 1]);
    b.Valid(p[t.step + 1], run[t.step + 2]);
    b.Finish();
  }
}

//------------------------------------------------------------------------------
// Coverage: the payloads' structure, read from their headers (FORMAT.md).

class Reader {
 public:
  explicit Reader(const Bytes& b, size_t begin = 0, size_t end = SIZE_MAX)
      : b_(b), pos_(begin), end_(std::min(end, b.size())) {}
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  uint8_t Byte() {
    if (pos_ >= end_) {
      ok_ = false;
      return 0;
    }
    return b_[pos_++];
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t c = Byte();
      v |= uint64_t{c & 0x7Fu} << shift;
      if (!(c & 0x80)) return v;
    }
    ok_ = false;
    return 0;
  }
  void Skip(uint64_t n) {
    if (n > end_ - pos_) {
      ok_ = false;
      pos_ = end_;
      return;
    }
    pos_ += n;
  }

 private:
  const Bytes& b_;
  size_t pos_, end_;
  bool ok_ = true;
};

std::map<std::string, uint64_t> g_coverage;

void Count(const std::string& key) { ++g_coverage[key]; }

// An XOR-stream body (version 1, or after Chunk_Mode 1).
// Returns whether it holds a change.
bool ScanXorChunk(Reader& r, const std::string& v) {
  const uint64_t changed = r.Varint();
  if (changed == 0) {
    Count(v + " xor chunk: nothing changed");
    return false;
  }
  const uint64_t high = r.Varint();
  const uint8_t layout = r.Byte();
  Count(v + std::string(" xor positions: ") + ((layout & 3) == 0 ? "bitmap" : "gaps"));
  if (high > 0) Count(v + " xor: high records");
  const char* names[] = {"stored", "lz4", "zstd"};
  const char* streams[] = {"positions", "mantissas", "high"};
  for (int s = 0; s < (high > 0 ? 3 : 2); ++s) {
    const uint8_t codec = r.Byte();
    const uint64_t raw = r.Varint();
    const uint64_t stored = codec != 0 ? r.Varint() : raw;
    r.Skip(stored);
    Count(v + " xor stream codec: " + (codec < 3 ? names[codec] : "?") + " (" + streams[s] + ")");
  }
  return true;
}

// The frame of a payload the library accepted, and delta_stats's view of it.
void Scan(const Bytes& p) {
  Reader r(p);
  for (int i = 0; i < 4; ++i) r.Byte();
  const uint8_t version = r.Byte();
  const uint8_t flags = r.Byte();
  const uint64_t n = r.Varint();
  const int chunk_log = r.Byte();
  const bool session = flags & 1, tensors = flags & 2, continues = flags & 4;
  const std::string v = version == 1 ? "v1" : "v16";
  Count("frame: version " + std::to_string(version));
  if (version == 16) {
    std::string f = session ? "Session" : "";
    if (tensors) f += f.empty() ? "Tensors" : "+Tensors";
    if (continues) f += "+Continues";
    Count("frame flags: " + (f.empty() ? std::string("none") : f));
    if (session && !continues) r.Skip(8);
    if (session) r.Skip(8);
    if (tensors && !continues) {
      const uint64_t k = r.Varint();
      r.Skip(4);
      Count(k == 0   ? "frame: Tensor_Count 0"
            : k == 1 ? "frame: Tensor_Count 1"
                     : "frame: Tensor_Count > 1");
    }
  }
  const uint64_t chunk = uint64_t{1} << chunk_log;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  Count(v + std::string(" frame chunks: ") + (chunks == 0 ? "0" : chunks == 1 ? "1" : "many"));
  if (chunks > 0 && n % chunk != 0) Count(v + " frame: short last chunk");
  std::vector<uint64_t> sizes;
  const uint64_t listed = version == 1 ? chunks : (chunks > 0 ? chunks - 1 : 0);
  for (uint64_t k = 0; k < listed; ++k) sizes.push_back(r.Varint());
  uint64_t modes[5] = {0, 0, 0, 0, 0};
  size_t at = r.pos();
  for (uint64_t k = 0; k < chunks && r.ok(); ++k) {
    const size_t end = k < sizes.size() ? at + sizes[k] : p.size();
    Reader c(p, at, end);
    if (version == 1) {
      ++modes[ScanXorChunk(c, v) ? 1 : 0];
    } else {
      const uint8_t mode = c.Byte();
      if (mode > 4) Die("chunk mode " + std::to_string(mode) + " in a valid payload");
      ++modes[mode];
      Count("v16 chunk mode " + std::to_string(mode));
      if (session) Count("v16 chunk mode " + std::to_string(mode) + " in a session frame");
      if (mode == 1) ScanXorChunk(c, v);
      if (mode == 2) {
        const uint8_t layout = c.Byte();
        Count("modelled block size " + std::to_string(4 << (layout & 7)));
        const char* bits[] = {"history (bit 3)", "value priors (bit 4)", "carried model (bit 5)",
                              "column signs (bit 6)", "capped rates (bit 7)"};
        for (int bit = 3; bit < 8; ++bit) {
          if (layout & (1 << bit)) Count(std::string("modelled layout: ") + bits[bit - 3]);
        }
        if (!(layout & 0x10)) Count("modelled layout: no value priors");
        if (session) {
          Count(std::string("modelled in a session frame") +
                (layout & 8 ? "" : ", without history"));
        }
      }
    }
    at = end;
  }
  if (!r.ok()) Die("a valid payload's header does not parse");
  arc_v3::PayloadStats stats;
  Check(arc_v3::delta_stats(p.data(), p.size(), &stats), "delta_stats");
  uint64_t total = 0;
  for (int m = 0; m < 5; ++m) total += stats.chunk_modes[m];
  if (total != chunks) {
    Die("delta_stats counts " + std::to_string(total) + " chunks, the header " +
        std::to_string(chunks));
  }
  for (int m = 0; m < 5; ++m) {
    if (stats.chunk_modes[m] != modes[m]) {
      Die("delta_stats and the chunk headers disagree on chunks of mode " + std::to_string(m));
    }
  }
}

//------------------------------------------------------------------------------
// Output

namespace fs = std::filesystem;

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void WriteFile(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) Die("cannot write " + path.string());
}

// Writes one case; files of equal contents within it are written once. Returns the bytes
// written.
uint64_t WriteCase(const fs::path& root, const Case& c) {
  const fs::path dir = root / c.name;
  fs::create_directories(dir);
  std::map<std::string, std::string> names;  // contents -> file name
  std::map<char, int> next;
  uint64_t written = 0;
  // A file named by the kind that first has its contents (a step's dst is the next one's src).
  auto file = [&](char kind, const void* data, size_t bytes) {
    const std::string key(static_cast<const char*>(data), bytes);
    auto it = names.find(key);
    if (it != names.end()) return it->second;
    const std::string name = std::string(1, kind) + std::to_string(next[kind]++) + ".bin";
    WriteFile(dir / name, data, bytes);
    written += bytes;
    names.emplace(std::move(key), name);
    return name;
  };
  std::string j = "{\"name\": " + Json(c.name) + ", \"note\": " + Json(c.note) +
                  ", \"session\": " + (c.session ? "true" : "false") + ",\n \"steps\": [";
  for (size_t k = 0; k < c.steps.size(); ++k) {
    const Step& s = c.steps[k];
    j += k ? ",\n  " : "\n  ";
    j += "{\"payload\": " + Json(file('p', s.payload.data(), s.payload.size()));
    j += ", \"src\": " + Json(file('s', s.src.data(), s.src.size() * 2));
    if (s.counts) {
      j += ", \"counts\": [";
      for (size_t t = 0; t < s.counts->size(); ++t) {
        j += (t ? ", " : "") + std::to_string((*s.counts)[t]);
      }
      j += "]";
    } else {
      j += ", \"counts\": null";
    }
    j += ", \"checksum\": \"" + Hex16(s.checksum) + "\", \"expect\": " + Json(s.expect);
    j += ", \"dst\": " +
         (s.expect == "ok" ? Json(file('d', s.dst.data(), s.dst.size() * 2)) : "null");
    if (s.reset) j += ", \"reset\": true";
    j += ", \"note\": " + Json(s.note) + "}";
  }
  j += "\n]}\n";
  WriteFile(dir / "case.json", j.data(), j.size());
  return written + j.size();
}

std::string KindOf(const std::string& name) { return name.substr(0, name.find('-')); }

// What the cases must cover (FORMAT.md's features); missing ones fail the run.
const char* const kRequired[] = {
    "frame: version 1",
    "frame: version 16",
    "frame flags: none",
    "frame flags: Tensors",
    "frame flags: Session",
    "frame flags: Session+Continues",
    "frame flags: Session+Tensors",
    "frame flags: Session+Tensors+Continues",
    "frame: Tensor_Count 0",
    "frame: Tensor_Count 1",
    "frame: Tensor_Count > 1",
    "v1 frame chunks: 0",
    "v1 frame chunks: 1",
    "v1 frame chunks: many",
    "v1 frame: short last chunk",
    "v16 frame chunks: 0",
    "v16 frame chunks: 1",
    "v16 frame chunks: many",
    "v16 frame: short last chunk",
    "v1 xor chunk: nothing changed",
    "v1 xor positions: bitmap",
    "v1 xor positions: gaps",
    "v1 xor: high records",
    "v1 xor stream codec: stored (positions)",
    "v1 xor stream codec: lz4 (positions)",
    "v1 xor stream codec: zstd (positions)",
    "v1 xor stream codec: stored (mantissas)",
    "v1 xor stream codec: zstd (mantissas)",
    "v1 xor stream codec: stored (high)",
    "v16 chunk mode 0",
    "v16 chunk mode 1",
    "v16 chunk mode 2",
    "v16 chunk mode 3",
    "v16 chunk mode 4",
    "v16 chunk mode 0 in a session frame",
    "v16 chunk mode 1 in a session frame",
    "v16 chunk mode 2 in a session frame",
    "v16 chunk mode 3 in a session frame",
    "v16 xor positions: bitmap",
    "v16 xor positions: gaps",
    "v16 xor: high records",
    "v16 xor stream codec: lz4 (positions)",
    "v16 xor stream codec: zstd (positions)",
    "v16 xor stream codec: stored (mantissas)",
    "modelled layout: history (bit 3)",
    "modelled layout: value priors (bit 4)",
    "modelled layout: carried model (bit 5)",
    "modelled layout: column signs (bit 6)",
    "modelled layout: capped rates (bit 7)",
    "modelled in a session frame, without history",
    "modelled block size 4",
    "modelled block size 64",
    "expect: ok",
    "expect: size_mismatch",
    "expect: truncated",
    "expect: bad_magic",
    "expect: unsupported_version",
    "expect: reserved_bits_set",
    "expect: corrupt_header",
    "expect: corrupt_chunk",
    "expect: codec_failure",
    "expect: checksum_mismatch",
    "expect: wrong_base",
    "expect: history_mismatch",
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: %s OUT\n  writes OUT/payloads/<name>/ (tests/from_spec/README.md)\n",
                 argv[0]);
    return 2;
  }
  const uint16_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) {
    Die("the cases are written little-endian: a big-endian host");
  }
  const fs::path root = fs::path(argv[1]) / "payloads";
  if (fs::exists(root) && !fs::is_empty(root)) Die(root.string() + " exists: remove it first");

  MatrixCases();
  EdgeCases();
  TensorCases();
  SessionCases();
  CorruptionCases();

  std::set<Bytes> scanned;
  std::map<std::string, std::array<uint64_t, 3>> kinds;  // cases, steps, bytes
  uint64_t total = 0;
  for (const Case& c : g_cases) {
    for (const Step& s : c.steps) {
      Count("expect: " + s.expect);
      if (s.expect == "ok" && scanned.insert(s.payload).second) Scan(s.payload);
    }
    const uint64_t bytes = WriteCase(root, c);
    auto& k = kinds[KindOf(c.name)];
    k[0] += 1;
    k[1] += c.steps.size();
    k[2] += bytes;
    total += bytes;
  }
  std::fprintf(stderr, "make_cases: %zu cases, %.2f MB in %s\n", g_cases.size(), total / 1e6,
               root.string().c_str());
  for (const auto& [kind, k] : kinds) {
    std::fprintf(stderr, "  %-8s %5" PRIu64 " cases %6" PRIu64 " steps %8.2f MB\n", kind.c_str(),
                 k[0], k[1], k[2] / 1e6);
  }
  std::fprintf(stderr, "coverage (distinct valid payloads; steps for expect):\n");
  for (const auto& [key, count] : g_coverage) {
    std::fprintf(stderr, "  %-58s %8" PRIu64 "\n", key.c_str(), count);
  }
  std::fprintf(stderr, "damaged payloads the library accepted (left out):\n");
  for (const auto& [kind, count] : g_dropped) {
    std::fprintf(stderr, "  %-58s %8" PRIu64 "\n", kind.c_str(), count);
  }
  bool missing = false;
  for (const char* key : kRequired) {
    if (!g_coverage.count(key)) {
      std::fprintf(stderr, "make_cases: MISSING coverage: %s\n", key);
      missing = true;
    }
  }
  return missing ? 1 : 0;
}

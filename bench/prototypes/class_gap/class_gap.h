// Prototype of issue #43's "class-gap" payload for one BF16 tensor delta (benchmark only:
// not part of the library or its format). x86-64 with AVX-512 (F, BW, VL, VPOPCNTDQ) and
// BMI2 only.
//
// Model: element i is in class c(i) = clamp(exponent(base[i]) - e0, 0, K-1). Within each
// class, changes are i.i.d.: a change's position is coded as the GAP (number of unchanged
// members of its class skipped) since the previous change of the same class, and its
// value as d = key(new) - key(base) (monotone BF16 order): +1, -1 or an escape (sign,
// log2 class j, j raw bits). Entropy work is per change; the only per-element work is the
// class pass (exponent -> per-class bitmap), fused with the copy base -> out, and XXH3.
//
// Payload of one tensor (0 bytes for a tensor without changes):
//   e0 (u8) | gq[K] (u8: gap parameter per class, 255 = class has no change)
//   | vq[c] (u8: value parameter, only for classes with changes)
//   | 4 x u32: final rANS states (values even/odd, gaps even/odd) | nwords (varint)
//   | nwords u16 rANS words | raw-bit stream (bytes, to the end)
// The checksum (XXH3-64 of the result) travels beside the payload, as arc_v3's does.
//
// Gap symbols (state B), parameter q: p = 2^(-q/8) (the class's change rate), coarse unit
// 2^sh, sh = max(0, floor(log2(mean gap)) - 1); coarse = g >> sh is coded as a run of
// symbols 15 (each +15) ended by a symbol 0..14, geometric distribution (memoryless, so the
// repeats cost what the geometric says); the sh low bits are raw.
// Value symbols (state A), parameter v: ternary {+1, -1, escape} with P(escape) =
// 2^(-((v>>4)+1)/2); an escape then codes (j = 1..15, sign), P(j) ~ rho^(j-1) with
// rho = (v&15)/16 + 1/32, then j raw bits: |d| = 2^j + bits.
// Tables are functions of one byte each, built once per process (a static codebook): a
// small tensor does not pay to build tables, and the hot ones are tiny (16 cumulative
// frequencies: the symbol is found with one SIMD compare, no big lookup table to miss).
//
// Decode order (the encoder reproduces it): the first gap of every active class (class
// order), then tile by tile (kTile elements), class by class, each change of that class in
// the tile in ascending order: value symbol(s) (state A), then the class's next gap (state
// B). The last gap of a class counts the members left after its last change.
#ifndef ARC_V3_BENCH_PROTOTYPES_CLASS_GAP_CLASS_GAP_H_
#define ARC_V3_BENCH_PROTOTYPES_CLASS_GAP_CLASS_GAP_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/bf16.h"
#include "bench/generator.h"
#include "src/common/xxh3.h"

namespace arc_v3 {
namespace bench {
namespace class_gap {

constexpr int K = 8;             // classes
constexpr size_t kTile = 16384;  // elements per tile (32 KB of BF16)
constexpr size_t kWords = kTile / 64;
constexpr int kScaleBits = 12;  // rANS probability scale
constexpr uint32_t kScale = 1u << kScaleBits;
constexpr int kRun = 15;      // gap symbol "coarse += 15, continue"
constexpr int kEscSyms = 30;  // escape: 2 (j - 1) + neg, j = 1..15
constexpr int kInactive = 255;

// ---------------------------------------------------------------- tables
// Up to 16 symbols, found by comparing the slot with the cumulative frequencies.
struct alignas(32) Small {
  uint16_t cum[16];  // unused entries 0xFFFF
  uint16_t freq[16];
  float cost[16];
  int sh = 0;  // gap tables: raw low bits per gap
};
struct Esc {  // 30 symbols, u8 lookup (rarely used)
  uint8_t lut[kScale];
  uint16_t cum[kEscSyms], freq[kEscSyms];
  float cost[kEscSyms];
};

inline void Quantize(const double* p, int n, uint16_t* freq, uint16_t* cum, float* cost) {
  int f[32], sum = 0;
  for (int s = 0; s < n; ++s) {
    f[s] = std::max(1, int(p[s] * kScale + 0.5));
    sum += f[s];
  }
  while (sum != int(kScale)) {  // fix the total on the largest symbol(s)
    const int s = int(std::max_element(f, f + n) - f);
    const int delta = std::max(int(kScale) - sum, 1 - f[s]);
    f[s] += delta;
    sum += delta;
  }
  uint32_t c = 0;
  for (int s = 0; s < n; ++s) {
    freq[s] = uint16_t(f[s]);
    cum[s] = uint16_t(c);
    cost[s] = float(kScaleBits - std::log2(double(f[s])));
    c += f[s];
  }
}

inline void BuildGap(int q, Small* t) {
  const double p = std::min(std::exp2(-q / 8.0), 0.999);
  const double mean = (1 - p) / p;
  t->sh = mean >= 4 ? int(std::floor(std::log2(mean))) - 1 : 0;
  const double r = std::pow(1 - p, double(1u << t->sh));  // P(coarse >= s+1 | >= s)
  double pr[16], reach = 1;
  for (int s = 0; s < kRun; ++s) {
    pr[s] = reach * (1 - r);
    reach *= r;
  }
  pr[kRun] = reach;
  Quantize(pr, 16, t->freq, t->cum, t->cost);
}

inline void BuildTernary(int v, Small* t) {
  const double pesc = std::exp2(-((v >> 4) + 1) / 2.0);
  const double pr[3] = {(1 - pesc) / 2, (1 - pesc) / 2, pesc};
  for (int s = 0; s < 16; ++s) {
    t->cum[s] = 0xFFFF;
    t->freq[s] = 0;
  }
  Quantize(pr, 3, t->freq, t->cum, t->cost);
}

inline void BuildEsc(int b, Esc* t) {
  const double rho = b / 16.0 + 1 / 32.0;
  double pr[kEscSyms], w = 0;
  for (int j = 1; j <= 15; ++j) w += std::pow(rho, j - 1);
  for (int j = 1; j <= 15; ++j)
    pr[2 * (j - 1)] = pr[2 * (j - 1) + 1] = std::pow(rho, j - 1) / w / 2;
  Quantize(pr, kEscSyms, t->freq, t->cum, t->cost);
  for (int s = 0; s < kEscSyms; ++s)
    for (int k = 0; k < t->freq[s]; ++k) t->lut[t->cum[s] + k] = uint8_t(s);
}

struct Codebook {
  std::vector<Small> gap, tern;
  std::vector<Esc> esc;
  Codebook() : gap(255), tern(16), esc(16) {
    for (int q = 0; q < 255; ++q) BuildGap(q, &gap[q]);
    for (int a = 0; a < 16; ++a) BuildTernary(a << 4, &tern[a]);
    for (int b = 0; b < 16; ++b) BuildEsc(b, &esc[b]);
  }
};
inline const Codebook& Book() {
  static const Codebook* book = new Codebook();
  return *book;
}

// ---------------------------------------------------------------- class pass
// Copies base[0..n) (n <= kTile) to out (kCopy) and writes the per-class bitmaps of the
// tile: bit b of u64 word bm[c * kWords + w] = element 64 w + b is in class c (0 past n).
template <bool kCopy>
inline void ClassPass(const uint16_t* base, uint16_t* out, size_t n, int e0, uint32_t* bm) {
  const __m512i vmask = _mm512_set1_epi16(0xFF), ve0 = _mm512_set1_epi16(short(e0)),
                vkm = _mm512_set1_epi16(K - 1);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i v = _mm512_loadu_si512(base + i);
    if (kCopy) _mm512_storeu_si512(out + i, v);
    const __m512i c = _mm512_min_epu16(
        _mm512_subs_epu16(_mm512_and_si512(_mm512_srli_epi16(v, 7), vmask), ve0), vkm);
    for (int k = 0; k < K; ++k)
      bm[k * (kTile / 32) + i / 32] = _mm512_cmpeq_epi16_mask(c, _mm512_set1_epi16(short(k)));
  }
  if (i < n) {
    const __mmask32 live = (1u << (n - i)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi16(live, base + i);
    if (kCopy) _mm512_mask_storeu_epi16(out + i, live, v);
    const __m512i c = _mm512_min_epu16(
        _mm512_subs_epu16(_mm512_and_si512(_mm512_srli_epi16(v, 7), vmask), ve0), vkm);
    for (int k = 0; k < K; ++k)
      bm[k * (kTile / 32) + i / 32] =
          _mm512_mask_cmpeq_epi16_mask(live, c, _mm512_set1_epi16(short(k)));
    i += 32;
  }
  for (; i < kTile; i += 32)
    for (int k = 0; k < K; ++k) bm[k * (kTile / 32) + i / 32] = 0;
}

inline int ClassOf(uint16_t b, int e0) {
  return std::min(std::max(ExponentField(b) - e0, 0), K - 1);
}

// The BF16 value d steps (monotone order) from b.
inline uint16_t Apply(uint16_t b, int32_t d) {
  const int32_t k = MonotoneKey(b) + d;
  return k >= 0 ? uint16_t(k) : uint16_t(0x7FFF - k);
}

// ---------------------------------------------------------------- encoder
struct BitWriter {
  std::vector<uint8_t> bytes;
  uint64_t acc = 0;
  int fill = 0;
  void Put(uint64_t v, int n) {  // n <= 32
    acc |= v << fill;
    fill += n;
    while (fill >= 8) {
      bytes.push_back(uint8_t(acc));
      acc >>= 8;
      fill -= 8;
    }
  }
  void Flush() {
    if (fill) bytes.push_back(uint8_t(acc));
    acc = 0;
    fill = 0;
  }
};

inline void PutVarint(std::vector<uint8_t>* o, uint64_t v) {
  while (v >= 128) {
    o->push_back(uint8_t(v | 128));
    v >>= 7;
  }
  o->push_back(uint8_t(v));
}

struct EncScratch {
  std::vector<uint32_t> bm, pos, syms;  // syms: freq << 16 | cum
  std::vector<uint8_t> gap_flag;        // per symbol: 1 = gap (state B), 0 = value (state A)
  std::vector<uint64_t> rank;
  std::vector<uint8_t> cls;
  std::vector<uint16_t> words;
};

// value -> ternary symbol (0: +1, 1: -1, 2: escape) and escape symbol / raw bits
inline int ValSym(int32_t d, int* esc, int* j, uint32_t* low) {
  if (d == 1) return 0;
  if (d == -1) return 1;
  const uint32_t mag = uint32_t(d < 0 ? -d : d);
  *j = 31 - __builtin_clz(mag);
  *low = mag - (1u << *j);
  *esc = 2 * (*j - 1) + (d < 0);
  return 2;
}

// Encodes next given base (count elements) into out (replaced).
inline void Encode(const uint16_t* base, const uint16_t* next, size_t count,
                   std::vector<uint8_t>* out, EncScratch* s) {
  out->clear();
  const Codebook& book = Book();
  // 1. changes and exponent histograms
  uint32_t hist_e[256] = {0}, hist_ce[256] = {0};
  s->pos.clear();
  {
    uint32_t h[4][256] = {{0}};
    size_t i = 0;
    for (; i + 4 <= count; i += 4)
      for (int k = 0; k < 4; ++k) h[k][ExponentField(base[i + k])]++;
    for (; i < count; ++i) h[0][ExponentField(base[i])]++;
    for (int e = 0; e < 256; ++e) hist_e[e] = h[0][e] + h[1][e] + h[2][e] + h[3][e];
    i = 0;
    for (; i + 32 <= count; i += 32) {
      __mmask32 m =
          _mm512_cmpneq_epi16_mask(_mm512_loadu_si512(base + i), _mm512_loadu_si512(next + i));
      while (m) {
        s->pos.push_back(uint32_t(i + __builtin_ctz(m)));
        m &= m - 1;
      }
    }
    for (; i < count; ++i)
      if (base[i] != next[i]) s->pos.push_back(uint32_t(i));
    for (uint32_t p : s->pos) hist_ce[ExponentField(base[p])]++;
  }
  if (s->pos.empty()) return;
  // 2. e0: the best split into K classes (ideal i.i.d. cost), then per-class parameters
  auto entropy_bits = [](double changed, double members) {
    if (changed <= 0 || changed >= members) return 0.0;
    const double p = changed / members;
    return -members * (p * std::log2(p) + (1 - p) * std::log2(1 - p));
  };
  int e0 = 0;
  double best = 1e300;
  for (int cand = 0; cand < 256; ++cand) {
    double n[K] = {0}, k[K] = {0};
    for (int e = 0; e < 256; ++e) {
      const int c = std::min(std::max(e - cand, 0), K - 1);
      n[c] += hist_e[e];
      k[c] += hist_ce[e];
    }
    double b = 0;
    for (int c = 0; c < K; ++c) b += entropy_bits(k[c], n[c]);
    if (b < best - 1e-9) {
      best = b;
      e0 = cand;
    }
  }
  uint64_t n_c[K] = {0}, k_c[K] = {0};
  for (int e = 0; e < 256; ++e) {
    const int c = std::min(std::max(e - e0, 0), K - 1);
    n_c[c] += hist_e[e];
    k_c[c] += hist_ce[e];
  }
  uint8_t gq[K], vq[K];
  uint32_t th[K][3] = {{0}}, eh[K][kEscSyms] = {{0}};
  for (uint32_t p : s->pos) {
    int esc = 0, j = 0;
    uint32_t low = 0;
    const int c = ClassOf(base[p], e0);
    const int t = ValSym(MonotoneKey(next[p]) - MonotoneKey(base[p]), &esc, &j, &low);
    th[c][t]++;
    if (t == 2) eh[c][esc]++;
  }
  for (int c = 0; c < K; ++c) {
    if (!k_c[c]) {
      gq[c] = kInactive;
      vq[c] = 0;
      continue;
    }
    const double p = double(k_c[c]) / double(n_c[c]);
    gq[c] = uint8_t(std::min(254.0, std::max(0.0, std::round(-8 * std::log2(p)))));
    double bc = 1e300;
    int ba = 0, bb = 0;
    for (int a = 0; a < 16; ++a) {
      double cost = 0;
      for (int t = 0; t < 3; ++t) cost += th[c][t] * double(book.tern[a].cost[t]);
      if (cost < bc) {
        bc = cost;
        ba = a;
      }
    }
    bc = 1e300;
    for (int b = 0; b < 16; ++b) {
      double cost = 0;
      for (int e = 0; e < kEscSyms; ++e) cost += eh[c][e] * double(book.esc[b].cost[e]);
      if (cost < bc) {
        bc = cost;
        bb = b;
      }
    }
    vq[c] = uint8_t(ba << 4 | bb);
  }
  // 3. member rank of every change (per-class prefix popcounts of the tile bitmaps)
  const size_t tiles = (count + kTile - 1) / kTile;
  s->bm.resize(K * (kTile / 32));
  s->rank.resize(s->pos.size());
  s->cls.resize(s->pos.size());
  uint64_t rank_base[K] = {0};
  {
    size_t pi = 0;
    static thread_local uint64_t pre[K][kWords];  // members of class c before word x
    for (size_t t = 0; t < tiles; ++t) {
      const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
      if (pi == s->pos.size()) break;
      ClassPass<false>(base + t0, nullptr, n, e0, s->bm.data());
      const uint64_t* bm64 = reinterpret_cast<const uint64_t*>(s->bm.data());
      for (int c = 0; c < K; ++c) {
        if (gq[c] == kInactive) continue;
        uint64_t r = rank_base[c];
        for (size_t x = 0; x < kWords; ++x) {
          pre[c][x] = r;
          r += __builtin_popcountll(bm64[c * kWords + x]);
        }
        rank_base[c] = r;
      }
      for (; pi < s->pos.size() && s->pos[pi] < t0 + n; ++pi) {
        const uint32_t local = uint32_t(s->pos[pi] - t0);
        const int c = ClassOf(base[s->pos[pi]], e0);
        s->rank[pi] =
            pre[c][local / 64] + __builtin_popcountll(bm64[c * kWords + local / 64] &
                                                      ((uint64_t{1} << (local % 64)) - 1));
        s->cls[pi] = uint8_t(c);
      }
    }
  }
  // 4. symbols in decode order (rANS intervals) and raw bits
  BitWriter bits;
  s->syms.clear();
  s->gap_flag.clear();
  auto sym = [&](bool gap, uint32_t freq, uint32_t cum) {
    s->syms.push_back(freq << 16 | cum);
    s->gap_flag.push_back(gap);
  };
  int64_t last_rank[K];
  for (int c = 0; c < K; ++c) last_rank[c] = -1;
  auto put_gap = [&](int c, uint64_t g) {
    const Small& tb = book.gap[gq[c]];
    uint64_t coarse = g >> tb.sh;
    while (coarse >= kRun) {
      sym(true, tb.freq[kRun], tb.cum[kRun]);
      coarse -= kRun;
    }
    sym(true, tb.freq[coarse], tb.cum[coarse]);
    bits.Put(g & ((uint64_t{1} << tb.sh) - 1), tb.sh);
  };
  std::vector<uint32_t> by_class[K];
  for (size_t k = 0; k < s->pos.size(); ++k) by_class[s->cls[k]].push_back(uint32_t(k));
  size_t cursor[K] = {0};
  auto next_gap = [&](int c) {  // gap to the class's next change, or the terminator
    if (cursor[c] < by_class[c].size()) {
      const uint64_t r = s->rank[by_class[c][cursor[c]]];
      put_gap(c, r - uint64_t(last_rank[c] + 1));
      last_rank[c] = int64_t(r);
    } else {
      put_gap(c, n_c[c] - uint64_t(last_rank[c] + 1));
    }
  };
  for (int c = 0; c < K; ++c)
    if (gq[c] != kInactive) next_gap(c);
  for (size_t t = 0; t < tiles; ++t) {
    const size_t t1 = std::min(count, (t + 1) * kTile);
    for (int c = 0; c < K; ++c) {
      if (gq[c] == kInactive) continue;
      const Small& tt = book.tern[vq[c] >> 4];
      const Esc& et = book.esc[vq[c] & 15];
      while (cursor[c] < by_class[c].size() && s->pos[by_class[c][cursor[c]]] < t1) {
        const uint32_t p = s->pos[by_class[c][cursor[c]]];
        int esc = 0, j = 0;
        uint32_t low = 0;
        const int t3 = ValSym(MonotoneKey(next[p]) - MonotoneKey(base[p]), &esc, &j, &low);
        sym(false, tt.freq[t3], tt.cum[t3]);
        if (t3 == 2) {
          sym(false, et.freq[esc], et.cum[esc]);
          bits.Put(low, j);
        }
        ++cursor[c];
        next_gap(c);
      }
    }
  }
  bits.Flush();
  // 5. rANS, in reverse: state A (values), state B (gaps); x in [2^16, 2^32)
  // Symbol n of a kind (values / gaps) uses state n & 1 of that kind: xs[kind * 2 + (n & 1)].
  uint32_t xs[4] = {1u << 16, 1u << 16, 1u << 16, 1u << 16};
  size_t nk[2] = {0, 0};
  for (size_t k = 0; k < s->syms.size(); ++k) nk[s->gap_flag[k]]++;
  s->words.clear();
  for (size_t k = s->syms.size(); k-- > 0;) {
    const uint32_t f = s->syms[k] >> 16, cum = s->syms[k] & 0xFFFF;
    const int kind = s->gap_flag[k];
    uint32_t& x = xs[kind * 2 + (--nk[kind] & 1)];
    if (x >= (uint32_t{1} << (32 - kScaleBits)) * f) {
      s->words.push_back(uint16_t(x));
      x >>= 16;
    }
    x = (x / f << kScaleBits) + x % f + cum;
  }
  std::reverse(s->words.begin(), s->words.end());
  // 6. layout
  out->push_back(uint8_t(e0));
  for (int c = 0; c < K; ++c) out->push_back(gq[c]);
  for (int c = 0; c < K; ++c)
    if (gq[c] != kInactive) out->push_back(vq[c]);
  for (uint32_t x : xs)
    for (int b = 0; b < 4; ++b) out->push_back(uint8_t(x >> (8 * b)));
  PutVarint(out, s->words.size());
  const size_t at = out->size();
  out->resize(at + 2 * s->words.size());
  std::memcpy(out->data() + at, s->words.data(), 2 * s->words.size());
  out->insert(out->end(), bits.bytes.begin(), bits.bytes.end());
}

// ---------------------------------------------------------------- decoder
// Bytes past a payload's end that Decode may read (not use): a real decoder would copy its
// tail into a padded buffer; the benchmark pads every payload buffer instead.
constexpr size_t kReadPadding = 16;

// Decodes into out (count elements) from base; data[size, size + kReadPadding) must be
// readable. With kHash, streams out through XXH3-64 tile by tile (right after the tile is
// written) and compares with `checksum`. Returns false on a malformed payload or a wrong
// checksum. Timing variants: kWalk = false does the class pass + copy (+ hash) only;
// kSelect = false decodes the entropy streams without placing the changes (wrong output).
template <bool kWalk, bool kHash, bool kSelect = true>
inline bool Decode(const uint16_t* base, size_t count, const uint8_t* data, size_t size,
                   uint16_t* out, uint64_t checksum, XXH3_state_t* hs) {
  if (kHash) XXH3_64bits_reset(hs);
  const size_t tiles = (count + kTile - 1) / kTile;
  alignas(64) static thread_local uint32_t bm32[K * (kTile / 32)];
  if (size == 0 || !kWalk) {  // no changes: copy (+ hash); !kWalk: the class pass too
    for (size_t t = 0; t < tiles; ++t) {
      const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
      if (size)
        ClassPass<true>(base + t0, out + t0, n, data[0], bm32);
      else
        std::memcpy(out + t0, base + t0, 2 * n);
      if (kHash) XXH3_64bits_update(hs, out + t0, 2 * n);
    }
    return !kHash || XXH3_64bits_digest(hs) == checksum;
  }
  const Codebook& book = Book();
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  const int e0 = *p++;
  uint8_t gq[K], vq[K];
  int active[K], na = 0;
  for (int c = 0; c < K; ++c) {
    gq[c] = *p++;
    if (gq[c] != kInactive) active[na++] = c;
  }
  for (int c = 0; c < K; ++c) vq[c] = gq[c] != kInactive ? *p++ : 0;
  uint32_t xA0, xA1, xB0, xB1;
  std::memcpy(&xA0, p, 4);
  std::memcpy(&xA1, p + 4, 4);
  std::memcpy(&xB0, p + 8, 4);
  std::memcpy(&xB1, p + 12, 4);
  p += 16;
  uint64_t nwords = 0;
  for (int sh = 0;; sh += 7) {
    const uint8_t b = *p++;
    nwords |= uint64_t(b & 127) << sh;
    if (!(b & 128)) break;
  }
  if (p + 2 * nwords > end) return false;
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(p);
  const uint16_t* wend = wp + nwords;
  const uint8_t* bits = p + 2 * nwords;
  uint64_t bitpos = 0;
  auto read_bits = [&](int n) -> uint32_t {
    uint64_t w;
    std::memcpy(&w, bits + (bitpos >> 3), 8);
    const uint32_t v = uint32_t((w >> (bitpos & 7)) & ((uint64_t{1} << n) - 1));
    bitpos += n;
    return v;
  };
  auto renorm = [&](uint32_t& x) {
    const uint32_t w = *wp;
    const bool need = x < (1u << 16);
    x = need ? (x << 16 | w) : x;
    wp += need;
  };
  // One symbol of a <= 16-symbol table on state x0, then the two states swap (so that
  // consecutive symbols of one kind alternate between its two states).
  auto dec_small = [&](uint32_t& x0, uint32_t& x1, const Small& table) -> uint32_t {
    uint32_t x = x0;
    const uint32_t slot = x & (kScale - 1);
    const __m256i cv = _mm256_load_si256(reinterpret_cast<const __m256i*>(table.cum));
    const uint32_t s =
        31 - __builtin_clz(_mm256_cmple_epu16_mask(cv, _mm256_set1_epi16(short(slot))));
    x = table.freq[s] * (x >> kScaleBits) + slot - table.cum[s];
    renorm(x);
    x0 = x1;
    x1 = x;
    return s;
  };
  auto dec_gap = [&](int c) -> uint64_t {
    const Small& table = book.gap[gq[c]];
    uint64_t coarse = 0;
    uint32_t s;
    while ((s = dec_small(xB0, xB1, table)) == kRun) coarse += kRun;
    return ((coarse + s) << table.sh) | read_bits(table.sh);
  };
  uint64_t rem[K];  // per class: members (from the current tile's start) before its next change
  for (int a = 0; a < na; ++a) rem[active[a]] = dec_gap(active[a]);
  alignas(64) static thread_local uint32_t ranks[kTile];
  alignas(64) static thread_local int32_t vals[kTile];
  for (size_t t = 0; t < tiles; ++t) {
    const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
    ClassPass<true>(base + t0, out + t0, n, e0, bm32);
    const uint64_t* bm = reinterpret_cast<const uint64_t*>(bm32);
    const uint16_t* tb = base + t0;
    uint16_t* to = out + t0;
    for (int a = 0; a < na; ++a) {
      const int c = active[a];
      const uint64_t* w = bm + c * kWords;
      // members of the class in this tile
      __m512i acc = _mm512_setzero_si512();
      for (size_t x = 0; x < kWords; x += 8)
        acc = _mm512_add_epi64(acc, _mm512_popcnt_epi64(_mm512_load_si512(w + x)));
      // Summed through memory: GCC 12's _mm512_reduce_add_epi64 and _mm512_castsi512_si256
      // trip -Wmaybe-uninitialized in its own headers.
      alignas(64) uint64_t lanes[8];
      _mm512_store_si512(lanes, acc);
      uint64_t members = 0;
      for (uint64_t lane : lanes) members += lane;
      uint64_t r = rem[c];
      if (r >= members) {
        rem[c] = r - members;
        continue;
      }
      // 1. entropy: the class's changes in this tile -> (member rank, value); the loop
      //    branch mispredicts once per tile and class, not once per change.
      const Small& tt = book.tern[vq[c] >> 4];
      const Esc& et = book.esc[vq[c] & 15];
      size_t k = 0;
      do {
        ranks[k] = uint32_t(r);
        const uint32_t slot = xA0 & (kScale - 1);
        const uint32_t s3 = (slot >= tt.cum[1]) + (slot >= tt.cum[2]);
        uint32_t x = tt.freq[s3] * (xA0 >> kScaleBits) + slot - tt.cum[s3];
        renorm(x);
        xA0 = xA1;
        xA1 = x;
        int32_t d = 1 - 2 * int32_t(s3 & 1);
        if (__builtin_expect(s3 == 2, 0)) {
          const uint32_t es = et.lut[xA0 & (kScale - 1)];
          x = et.freq[es] * (xA0 >> kScaleBits) + (xA0 & (kScale - 1)) - et.cum[es];
          renorm(x);
          xA0 = xA1;
          xA1 = x;
          const int j = int(es >> 1) + 1;
          const int32_t mag = int32_t((1u << j) | read_bits(j));
          d = (es & 1) ? -mag : mag;
        }
        vals[k++] = d;
        r += dec_gap(c) + 1;
      } while (r < members);
      rem[c] = r - members;
      // 2. select: member ranks -> positions (walk the class bitmap), 3. scatter
      if (!kSelect) {
        to[ranks[k - 1] & (kTile - 1)] ^= uint16_t(vals[k - 1]);
        continue;
      }  // keeps the decode live
      size_t x = 0;
      uint64_t cum = 0, pc = __builtin_popcountll(w[0]);
      for (size_t q = 0; q < k; ++q) {
        const uint64_t rq = ranks[q];
        while (cum + pc <= rq) {
          cum += pc;
          ++x;
          pc = __builtin_popcountll(w[x]);
        }
        const size_t i = x * 64 + __builtin_ctzll(_pdep_u64(uint64_t{1} << (rq - cum), w[x]));
        to[i] = Apply(tb[i], vals[q]);
      }
    }
    if (kHash) XXH3_64bits_update(hs, to, 2 * n);
  }
  for (int a = 0; a < na; ++a)
    if (rem[active[a]] != 0) return false;
  const uint32_t L = 1u << 16;
  if (wp != wend || xA0 != L || xA1 != L || xB0 != L || xB1 != L) return false;
  return !kHash || XXH3_64bits_digest(hs) == checksum;
}

// ---------------------------------------------------------------- benchmark data
// The generated regimes of bench/arc_bench.cc (its --regimes low, mid, high).
struct RegimeSpec {
  const char* name;
  double density;
};
constexpr RegimeSpec kRegimes[3] = {{"gen_low", 0.002}, {"gen_mid", 0.02}, {"gen_high", 0.10}};
constexpr uint64_t kDefaultParams = 4'000'000;
constexpr int kDefaultDeltas = 2;

// One regime exactly as arc_bench generates it: GeneratorOptions{params, density, deltas},
// the other options at their defaults (seed 1, 3 burn-in steps). Exits on a generator error.
inline GeneratedRun GenerateRegime(const RegimeSpec& regime, uint64_t params, int deltas) {
  GeneratorOptions options;
  options.params = params;
  options.target_density = regime.density;
  options.deltas = deltas;
  GeneratedRun run;
  const Status status = Generate(options, &run);
  if (!status.ok()) {
    std::fprintf(stderr, "generator (%s): %s\n", regime.name, status.ToString().c_str());
    std::exit(2);
  }
  return run;
}

}  // namespace class_gap
}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_PROTOTYPES_CLASS_GAP_CLASS_GAP_H_

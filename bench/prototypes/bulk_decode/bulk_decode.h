#ifndef ARC_V3_BENCH_PROTOTYPES_BULK_DECODE_BULK_DECODE_H_
#define ARC_V3_BENCH_PROTOTYPES_BULK_DECODE_BULK_DECODE_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/bf16.h"
#include "bench/generator.h"
#include "src/common/xxh3.h"

namespace arc_v3 {
namespace bench {
namespace bulk_decode {

// Prototype of issue #55's payload (benchmark only: not part of the library or its
// format). x86-64 with AVX2, BMI1/2, LZCNT and POPCNT (the machine it was measured on has
// no AVX-512). The model is class_gap's (bench/prototypes/class_gap): element i is in
// class c(i) = clamp(exponent(base[i]) - e0, 0, K-1); within a class, changes are i.i.d.
// What changes is the layout, so that every entropy decode is a bulk loop over one
// stream with no context switch and no tile boundary:
//   - per class c, the k_c changes' member ranks as k_c gaps, exactly ONE rANS symbol per
//     gap (coarse = gap >> sh_c, 0..14; 15 = escape: coarse - 15 is Elias-gamma coded in
//     the serial bit area) plus sh_c raw low bits at a fixed width (random access: bit
//     offset n * sh_c, no serial bit reader in the loop);
//   - per class c, the k_c values as ONE ternary rANS symbol each (+1, -1, escape), then
//     the class's e_c escape symbols (j, sign) as their own stream, then j raw bits each
//     (serial bit area): |d| = 2^j + bits;
//   - every stream is decoded by N interleaved rANS states (symbol n of a stream on state
//     n & (N-1)), the states carried from stream to stream: N = 8 kGroups (AVX2
//     registers of 8 states) for a tensor with >= kWideMin changes, else N = 4
//     (scalar, 16 bytes, as class_gap). Symbols of a <= 16 (32) symbol table are found
//     by SIMD compares with the cumulative frequencies (scalar) or a 4 KB slot -> symbol
//     gather (AVX2): a 16 KB lookup table per class was refetched from memory per tensor.
// Decode order: gaps of every active class (class order), then values and escape symbols
// of every active class. Serial bit area: the gap escapes of every class in that order,
// then the value mantissas of every class in that order.
// Then tile by tile (kTile elements): a class pass copies base -> out and stores the
// tile's three class bit planes; per active class, its masks (from the planes), a
// per-word prefix count (i16) and per-16-word block starts; each change's member rank ->
// word by two 16-lane SIMD compares (block, then word: no branch per change) -> bit by
// pdep + tzcnt; the change applies at once (each class's changes come out in position
// order, matching its value stream: no merge). XXH3-64 of the tile follows.
// The branch-free non-BMI2 / Arm fallback of the select: the same two compares (NEON
// vcgtq_s16 + a horizontal add, or SVE cmpgt + cntp), then the bit by a rank-in-word
// step without pdep: a byte-wise popcount prefix of the word (or a 64-entry table of
// the word's set-bit positions built per word by compress/NEON table lookups) and one
// more compare. No branch per change in either.
//
// Payload of one tensor (0 bytes for a tensor without changes):
//   e0 (u8) | gq[K] (u8: gap parameter, 255 = no change in the class)
//   | per active class: vq (u8: ternary << 4 | escape parameter), k_c (varint)
//   | N x u32 final rANS states | nwords (varint) | nwords u16 rANS words
//   | fixed area: per active class k_c x sh_c bits (LSB first, classes back to back,
//     padded to a byte) | serial bit area (to the end)
// The checksum (XXH3-64 of the result) travels beside the payload, as arc_v3's does.

constexpr int K = 8;             // classes (positions and values)
constexpr size_t kTile = 16384;  // elements per tile (32 KB of BF16)
constexpr size_t kWords = kTile / 64;
constexpr int kScaleBits = 12;  // rANS probability scale
constexpr uint32_t kScale = 1u << kScaleBits;
constexpr uint32_t kL = 1u << 16;  // rANS state lower bound; 16-bit renormalisation
constexpr int kStates = 4;         // a tensor with fewer than kWideMin changes
constexpr int kGroups = 2;         // AVX2 registers of states (independent chains; 1 or 2) ...
constexpr int kWideStates = 8 * kGroups;  // ... for a tensor with >= kWideMin changes
constexpr uint64_t kWideMin =
    2048;                     // its 48 more bytes of final states: ~2% of its payload at most
constexpr int kEscGap = 15;   // gap symbol: coarse >= 15, rest in the serial area
constexpr int kEscSyms = 30;  // value escape: 2 (j - 1) + neg, j = 1..15
constexpr int kInactive = 255;

// ---------------------------------------------------------------- tables
// A decode table: per slot, sym << 25 | freq << 12 | (slot - cum[sym]).
struct Table {
  int n = 0, sh = 0;
  uint16_t freq[32] = {0}, cum[32] = {0};
  alignas(32) int16_t cmp[32];  // cum, 0x7FFF past n: the symbol of a slot is found by compares
  float cost[32] = {0};
  // Slot -> symbol, one byte each (+4 bytes: gathers read 32 bits), for the AVX2 decoder:
  // 4 KB per table, shared by the gap tables of one q mod 8 (see BuildGap).
  std::shared_ptr<std::vector<uint8_t>> sym_mem;
  const uint8_t* sym8 = nullptr;
  alignas(32) uint32_t freq32[16] = {0}, cum32[16] = {0};  // lanes of the AVX2 decoder
  void Finish() {
    sym_mem = std::make_shared<std::vector<uint8_t>>(kScale + 4);
    for (int s = 0; s < n; ++s)
      for (uint32_t k = 0; k < freq[s]; ++k) (*sym_mem)[cum[s] + k] = uint8_t(s);
    sym8 = sym_mem->data();
    for (int s = 0; s < 16 && s < n; ++s) {
      freq32[s] = freq[s];
      cum32[s] = cum[s];
    }
  }
};

inline void Quantize(const double* p, Table* t) {
  int f[32], sum = 0;
  const int n = t->n;
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
    t->freq[s] = uint16_t(f[s]);
    t->cum[s] = uint16_t(c);
    t->cost[s] = float(kScaleBits - std::log2(double(f[s])));
    c += f[s];
  }
  for (int s = 0; s < 32; ++s) t->cmp[s] = s < n ? int16_t(t->cum[s]) : int16_t(0x7FFF);
}

// Gap table q: change rate p = 2^(-q/8) within the class; coarse = gap >> sh, geometric
// (symbol 15 carries P(coarse >= 15)). The coarse distribution, r = (1-p)^(2^sh) per step,
// depends on q mod 8 alone once p is small, so every q >= 32 uses the coarse table of
// 32 + q % 8 with its own sh: 40 distinct decode tables (16 KB each), which stay in L2
// whichever classes and tensors use them (255 of them missed it at every use).
inline void BuildGap(int q, Table* t, const std::vector<Table>* built) {
  auto shift = [](int qq) {
    const double p = std::min(std::exp2(-qq / 8.0), 0.999);
    const double mean = (1 - p) / p;
    return mean >= 4 ? int(std::floor(std::log2(mean))) - 1 : 0;
  };
  if (q >= 40) {  // q' = 32 + q % 8 is built already
    *t = (*built)[32 + q % 8];
    t->sh = shift(q);
    return;
  }
  const double p = std::min(std::exp2(-q / 8.0), 0.999);  // q < 40: its own table
  t->sh = shift(q);
  const double r = std::pow(1 - p, double(1u << t->sh));
  double pr[16], reach = 1;
  for (int s = 0; s < kEscGap; ++s) {
    pr[s] = reach * (1 - r);
    reach *= r;
  }
  pr[kEscGap] = reach;
  t->n = 16;
  Quantize(pr, t);
  t->Finish();
}

// Ternary table a: {+1, -1, escape}, P(escape) = 2^(-(a+1)/2).
inline void BuildTernary(int a, Table* t) {
  const double pesc = std::exp2(-(a + 1) / 2.0);
  const double pr[3] = {(1 - pesc) / 2, (1 - pesc) / 2, pesc};
  t->n = 3;
  Quantize(pr, t);
}

// Escape table b: (j, sign), P(j) ~ rho^(j-1), rho = b/16 + 1/32.
inline void BuildEsc(int b, Table* t) {
  const double rho = b / 16.0 + 1 / 32.0;
  double pr[kEscSyms], w = 0;
  for (int j = 1; j <= 15; ++j) w += std::pow(rho, j - 1);
  for (int j = 1; j <= 15; ++j)
    pr[2 * (j - 1)] = pr[2 * (j - 1) + 1] = std::pow(rho, j - 1) / w / 2;
  t->n = kEscSyms;
  Quantize(pr, t);
  t->Finish();
}

// Tables are functions of one byte each, built once per process (a static codebook).
struct Codebook {
  std::vector<Table> gap, tern, esc;
  Codebook() : gap(255), tern(16), esc(16) {
    for (int q = 0; q < 255; ++q) BuildGap(q, &gap[q], &gap);
    for (int a = 0; a < 16; ++a) BuildTernary(a, &tern[a]);
    for (int b = 0; b < 16; ++b) BuildEsc(b, &esc[b]);
  }
};
inline const Codebook& Book() {
  static const Codebook* book = new Codebook();
  return *book;
}

// ---------------------------------------------------------------- class pass
// Encoder's class pass (the decoder's is PlanePass below). Copies base[0..n) (n <= kTile)
// to out (kCopy) and writes the bitmaps of the classes in
// `active` (bit c): bit b of u64 word bm[c * kWords + w] = element 64 w + b is in class c
// (0 past n). The class (3 bits) is packed to bytes and its bit planes taken with
// movemask; each class mask is an AND of three planes or their complements.
template <bool kCopy>
inline void ClassMasks(const uint16_t* base, uint16_t* out, size_t n, int e0, unsigned active,
                       uint32_t* bm) {
  static_assert(K == 8, "three bit planes");
  const __m256i vmask = _mm256_set1_epi16(0xFF), ve0 = _mm256_set1_epi16(short(e0)),
                vk = _mm256_set1_epi16(K - 1);
  alignas(32) uint16_t tmp[32];
  for (size_t i = 0; i < kTile; i += 32) {
    const uint16_t* src = base + i;
    uint32_t live = ~0u;
    if (i + 32 > n) {
      if (i >= n) {
        for (int c = 0; c < K; ++c) bm[c * (kTile / 32) + i / 32] = 0;
        continue;
      }
      std::memset(tmp, 0, sizeof tmp);
      std::memcpy(tmp, base + i, 2 * (n - i));
      src = tmp;
      live = (1u << (n - i)) - 1;
    }
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16));
    if (kCopy) {
      if (live == ~0u) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), v1);
      } else {
        std::memcpy(out + i, base + i, 2 * (n - i));
      }
    }
    const __m256i c0 = _mm256_min_epu16(
        _mm256_subs_epu16(_mm256_and_si256(_mm256_srli_epi16(v0, 7), vmask), ve0), vk);
    const __m256i c1 = _mm256_min_epu16(
        _mm256_subs_epu16(_mm256_and_si256(_mm256_srli_epi16(v1, 7), vmask), ve0), vk);
    const __m256i cb =
        _mm256_permute4x64_epi64(_mm256_packus_epi16(c0, c1), 0xD8);  // 32 class bytes in order
    const uint32_t p0 = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 7)));
    const uint32_t p1 = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 6)));
    const uint32_t p2 = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 5)));
    const uint32_t n0 = ~p0 & live, n1 = ~p1, n2 = ~p2, q0 = p0 & live;
    const uint32_t m[8] = {n0 & n1 & n2, q0 & n1 & n2, n0 & p1 & n2, q0 & p1 & n2,
                           n0 & n1 & p2, q0 & n1 & p2, n0 & p1 & p2, q0 & p1 & p2};
    for (int c = 0; c < K; ++c)
      if (active >> c & 1) bm[c * (kTile / 32) + i / 32] = m[c];
  }
}

inline int ClassOf(uint16_t b, int e0) {
  return std::min(std::max(ExponentField(b) - e0, 0), K - 1);
}

// The BF16 value d steps (monotone order) from b. Written with masks: GCC compiled the
// conditional form to a branch on the result's sign, mispredicted for half the weights.
inline uint16_t Apply(uint16_t b, int32_t d) {
  const int32_t kb = b, sb = -int32_t(b >> 15);               // sb: -1 for a negative base
  const int32_t k = ((kb & ~sb) | ((0x7FFF - kb) & sb)) + d;  // MonotoneKey(b) + d
  const int32_t m = k >> 31;
  return uint16_t((k & ~m) | ((0x7FFF - k) & m));
}

// ---------------------------------------------------------------- bits
struct BitWriter {
  std::vector<uint8_t> bytes;
  uint64_t acc = 0;
  int fill = 0;
  void Put(uint64_t v, int n) {  // n <= 32
    if (n == 0) return;
    acc |= (v & ((uint64_t{1} << n) - 1)) << fill;
    fill += n;
    while (fill >= 8) {
      bytes.push_back(uint8_t(acc));
      acc >>= 8;
      fill -= 8;
    }
  }
  void Gamma(
      uint64_t e) {  // e >= 0: v = e + 1 of bit length L: L-1 ones, a zero, the L-1 low bits of v
    const uint64_t v = e + 1;
    const int len = 64 - __builtin_clzll(v);
    Put((uint64_t{1} << (len - 1)) - 1, len - 1);
    Put(0, 1);
    Put(v, len - 1);
  }
  void Flush() {
    if (fill) bytes.push_back(uint8_t(acc));
    acc = 0;
    fill = 0;
  }
};

// Reads n <= 32 bits at bit offset pos of p (8 bytes readable from pos / 8).
inline uint32_t BitsAt(const uint8_t* p, uint64_t pos, int n) {
  uint64_t w;
  std::memcpy(&w, p + (pos >> 3), 8);
  return uint32_t(_bzhi_u64(w >> (pos & 7), unsigned(n)));
}

inline void PutVarint(std::vector<uint8_t>* o, uint64_t v) {
  while (v >= 128) {
    o->push_back(uint8_t(v | 128));
    v >>= 7;
  }
  o->push_back(uint8_t(v));
}

// ---------------------------------------------------------------- encoder
struct EncScratch {
  std::vector<uint32_t> bm, pos;
  std::vector<uint32_t> syms;  // freq << 16 | cum, decode order
  std::vector<uint8_t> sidx;   // state of each symbol
  std::vector<uint64_t> rank;
  std::vector<uint8_t> cls;
  std::vector<uint16_t> words;
  std::vector<uint32_t> by_class[K];
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
    for (; i + 16 <= count; i += 16) {
      const __m256i eq =
          _mm256_cmpeq_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + i)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(next + i)));
      uint32_t m = ~uint32_t(_mm256_movemask_epi8(eq)) & 0x55555555u;
      while (m) {
        s->pos.push_back(uint32_t(i + __builtin_ctz(m) / 2));
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
    for (size_t t = 0; t < tiles && pi < s->pos.size(); ++t) {
      const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
      ClassMasks<false>(base + t0, nullptr, n, e0, 0xFF, s->bm.data());
      const uint64_t* bm64 = reinterpret_cast<const uint64_t*>(s->bm.data());
      for (int c = 0; c < K; ++c) {
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
  for (int c = 0; c < K; ++c) s->by_class[c].clear();
  for (size_t k = 0; k < s->pos.size(); ++k) s->by_class[s->cls[k]].push_back(uint32_t(k));
  // 4. symbols in decode order, fixed-width low bits, serial bits
  const int nst = s->pos.size() >= kWideMin ? kWideStates : kStates;
  s->syms.clear();
  s->sidx.clear();
  BitWriter fixed, serial;
  for (int c = 0; c < K; ++c) {  // gaps
    if (gq[c] == kInactive) continue;
    const Table& tb = book.gap[gq[c]];
    int64_t last = -1;
    for (size_t n = 0; n < s->by_class[c].size(); ++n) {
      const int64_t r = int64_t(s->rank[s->by_class[c][n]]);
      const uint64_t g = uint64_t(r - last - 1);
      last = r;
      const uint64_t coarse = g >> tb.sh;
      const int sym = int(std::min<uint64_t>(coarse, kEscGap));
      s->syms.push_back(uint32_t(tb.freq[sym]) << 16 | tb.cum[sym]);
      s->sidx.push_back(uint8_t(n & (nst - 1)));
      fixed.Put(g, tb.sh);
      if (sym == kEscGap) serial.Gamma(coarse - kEscGap);
    }
  }
  fixed.Flush();
  for (int c = 0; c < K; ++c) {  // values, then their escape symbols; mantissas to the serial area
    if (gq[c] == kInactive) continue;
    const Table& tt = book.tern[vq[c] >> 4];
    const Table& et = book.esc[vq[c] & 15];
    std::vector<int> escs;
    for (size_t n = 0; n < s->by_class[c].size(); ++n) {
      const uint32_t p = s->pos[s->by_class[c][n]];
      int esc = 0, j = 0;
      uint32_t low = 0;
      const int t3 = ValSym(MonotoneKey(next[p]) - MonotoneKey(base[p]), &esc, &j, &low);
      s->syms.push_back(uint32_t(tt.freq[t3]) << 16 | tt.cum[t3]);
      s->sidx.push_back(uint8_t(n & (nst - 1)));
      if (t3 == 2) escs.push_back(esc);
    }
    for (size_t n = 0; n < escs.size(); ++n) {
      s->syms.push_back(uint32_t(et.freq[escs[n]]) << 16 | et.cum[escs[n]]);
      s->sidx.push_back(uint8_t(n & (nst - 1)));
    }
    for (size_t n = 0; n < s->by_class[c].size(); ++n) {
      const uint32_t p = s->pos[s->by_class[c][n]];
      int esc = 0, j = 0;
      uint32_t low = 0;
      if (ValSym(MonotoneKey(next[p]) - MonotoneKey(base[p]), &esc, &j, &low) == 2)
        serial.Put(low, j);
    }
  }
  serial.Flush();
  // 5. rANS, in reverse decode order; x in [2^16, 2^32)
  uint32_t xs[kWideStates];
  for (uint32_t& x : xs) x = kL;
  s->words.clear();
  for (size_t k = s->syms.size(); k-- > 0;) {
    const uint32_t f = s->syms[k] >> 16, cum = s->syms[k] & 0xFFFF;
    uint32_t& x = xs[s->sidx[k]];
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
  for (int c = 0; c < K; ++c) {
    if (gq[c] == kInactive) continue;
    out->push_back(vq[c]);
    PutVarint(out, k_c[c]);
  }
  for (int j = 0; j < nst; ++j)
    for (int b = 0; b < 4; ++b) out->push_back(uint8_t(xs[j] >> (8 * b)));
  PutVarint(out, s->words.size());
  const size_t at = out->size();
  out->resize(at + 2 * s->words.size());
  std::memcpy(out->data() + at, s->words.data(), 2 * s->words.size());
  out->insert(out->end(), fixed.bytes.begin(), fixed.bytes.end());
  out->insert(out->end(), serial.bytes.begin(), serial.bytes.end());
}

// ---------------------------------------------------------------- decoder
// Bytes past a payload's end that Decode may read (not use): a real decoder would copy its
// tail into a padded buffer; the benchmark pads every payload buffer instead.
constexpr size_t kReadPadding = 16;

// The entropy-decoded streams of one tensor: per active class, its changes' member ranks
// (ascending) and values (steps), at [off[c], off[c] + k[c]) of rank / val.
struct Streams {
  int e0 = 0;
  unsigned active = 0;
  uint64_t k[K] = {0}, off[K] = {0};
  std::vector<uint32_t> rank;
  std::vector<int32_t> val;
  std::vector<uint32_t> esc;  // scratch: indices of escapes
};

// rANS renormalisation without a branch (a branch here mispredicts every few symbols):
// x < 2^16 takes the next 16-bit word.
inline uint32_t Renorm(uint32_t x, const uint16_t*& wp) {
  const uint32_t need = x < kL;
  const uint32_t w = *wp;
  x = (x << (need << 4)) | (w & (0u - need));
  wp += need;
  return x;
}

// One rANS symbol on state x of a table of <= 16 (kWide: <= 32) symbols, found by
// comparing the slot with the cumulative frequencies (no lookup table to miss: a 16 KB
// table per class was refetched from memory for every tensor, ~30 cycles a symbol).
template <bool kWide>
inline uint32_t DecSmall(uint32_t& x, const Table& t, const uint16_t*& wp) {
  const uint32_t slot = x & (kScale - 1);
  const __m256i vs = _mm256_set1_epi16(short(slot));
  uint32_t above = uint32_t(_mm_popcnt_u32(uint32_t(_mm256_movemask_epi8(
      _mm256_cmpgt_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.cmp)), vs)))));
  if (kWide)
    above += uint32_t(_mm_popcnt_u32(uint32_t(_mm256_movemask_epi8(
        _mm256_cmpgt_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.cmp + 16)), vs)))));
  const uint32_t s = (kWide ? 31 : 15) - above / 2;
  x = Renorm(t.freq[s] * (x >> kScaleBits) + slot - t.cum[s], wp);
  return s;
}

// The 4 interleaved states; symbol n of a stream is decoded on state n & 3, the states
// carried from stream to stream.
struct States {
  uint32_t s[4];
};

// Runs the k symbols of one stream: step(x, n) decodes symbol n on state x. Written
// with the states and the word pointer in locals (kept in registers; a lambda capturing
// them by reference left them in memory, a store-forwarding chain per symbol).
template <class Step>
inline void RunStream(States* st, const uint16_t** wpp, uint64_t k, Step step) {
  uint32_t a = st->s[0], b = st->s[1], c = st->s[2], d = st->s[3];
  const uint16_t* wp = *wpp;
  uint64_t n = 0;
  for (; n + 4 <= k; n += 4) {
    step(a, n, wp);
    step(b, n + 1, wp);
    step(c, n + 2, wp);
    step(d, n + 3, wp);
  }
  if (n < k) step(a, n, wp);
  if (n + 1 < k) step(b, n + 1, wp);
  if (n + 2 < k) step(c, n + 2, wp);
  st->s[0] = a;
  st->s[1] = b;
  st->s[2] = c;
  st->s[3] = d;
  *wpp = wp;
}

// ---- AVX2 decoder: 8 states per register, symbol n of a stream on lane n % (8 kGroups) (the
// order of the scalar decoder: lanes that renormalise take the next words in lane order).
struct LaneTables {
  alignas(32) uint32_t expand[256][8];    // lane j of mask m: set bits of m below j
  alignas(32) uint32_t compress[256][8];  // j-th set bit of m
  LaneTables() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int j = 0; j < 8; ++j) {
        expand[m][j] = uint32_t(__builtin_popcount(m & ((1 << j) - 1)));
        compress[m][j] = 0;
      }
      for (int j = 0; j < 8; ++j)
        if (m >> j & 1) compress[m][k++] = uint32_t(j);
    }
  }
};
inline const LaneTables& Lanes() {
  static const LaneTables* t = new LaneTables();
  return *t;
}

// Lanes below 2^16 take the next words (no branch; 16 bytes read at wp).
inline __m256i RenormWide(__m256i x, const uint16_t*& wp, const LaneTables& lt) {
  const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  const uint32_t m = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
  const __m256i words =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp)));
  const __m256i w = _mm256_permutevar8x32_epi32(
      words, _mm256_load_si256(reinterpret_cast<const __m256i*>(lt.expand[m])));
  wp += _mm_popcnt_u32(m);
  return _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), w), need);
}

// Appends n + j for the lanes j of mask m to esc[ne..] (8 lanes written).
inline void AppendLanes(uint32_t m, uint64_t n, uint32_t* esc, size_t& ne, const LaneTables& lt) {
  const __m256i idx =
      _mm256_add_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(esc + ne),
      _mm256_permutevar8x32_epi32(
          idx, _mm256_load_si256(reinterpret_cast<const __m256i*>(lt.compress[m]))));
  ne += _mm_popcnt_u32(m);
}

// Gap stream, groups of 8: symbol by a gather from the 4 KB slot -> symbol table,
// frequency and start by lane permutes, low bits by a gather at bit offsets f0 + n sh
// (sh <= 24). Returns the symbols decoded (a multiple of 8; the caller does the rest).
inline uint64_t GapsWide(__m256i* X, const uint16_t*& wp, const Table& t, uint64_t k, uint32_t* g,
                         const uint8_t* fixed, uint64_t f0, int sh, uint32_t* esc, size_t& ne) {
  const LaneTables& lt = Lanes();
  const __m256i m12 = _mm256_set1_epi32(kScale - 1), mff = _mm256_set1_epi32(0xFF),
                seven = _mm256_set1_epi32(7);
  const __m256i flo = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.freq32));
  const __m256i fhi = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.freq32 + 8));
  const __m256i clo = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.cum32));
  const __m256i chi = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.cum32 + 8));
  const __m256i lane_off =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sh));
  const __m256i low_mask = _mm256_set1_epi32(int((1u << sh) - 1));
  const __m256i esc_sym = _mm256_set1_epi32(kEscGap);
  const __m128i shc = _mm_cvtsi32_si128(sh);
  const int* sym_base = reinterpret_cast<const int*>(t.sym8);
  const int* fixed_base = reinterpret_cast<const int*>(fixed);
  auto step = [&](__m256i& x, uint64_t at) {
    const __m256i slot = _mm256_and_si256(x, m12);
    const __m256i sym = _mm256_and_si256(_mm256_i32gather_epi32(sym_base, slot, 1), mff);
    const __m256i hi = _mm256_cmpgt_epi32(sym, seven);
    const __m256i f = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(flo, sym),
                                         _mm256_permutevar8x32_epi32(fhi, sym), hi);
    const __m256i cum = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(clo, sym),
                                           _mm256_permutevar8x32_epi32(chi, sym), hi);
    x = RenormWide(_mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, kScaleBits)),
                                    _mm256_sub_epi32(slot, cum)),
                   wp, lt);
    const __m256i off = _mm256_add_epi32(_mm256_set1_epi32(int(f0 + at * sh)), lane_off);
    const __m256i raw = _mm256_i32gather_epi32(fixed_base, _mm256_srli_epi32(off, 3), 1);
    const __m256i low =
        _mm256_and_si256(_mm256_srlv_epi32(raw, _mm256_and_si256(off, seven)), low_mask);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + at),
                        _mm256_or_si256(_mm256_sll_epi32(sym, shc), low));
    AppendLanes(uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(sym, esc_sym)))),
                at, esc, ne, lt);
  };
  uint64_t n = 0;
  for (; n + 8 * kGroups <= k; n += 8 * kGroups) {
    step(X[0], n);
    if constexpr (kGroups == 2) step(X[kGroups - 1], n + 8);
  }
  return n;
}

// Ternary value stream, groups of 8: two compares pick the symbol, blends its frequency
// and start. States as GapsWide. Returns the symbols decoded (a multiple of 8 kGroups).
inline uint64_t TernWide(__m256i* X, const uint16_t*& wp, const Table& t, uint64_t k, int32_t* v,
                         uint32_t* esc, size_t& ne) {
  const LaneTables& lt = Lanes();
  const __m256i m12 = _mm256_set1_epi32(kScale - 1), one = _mm256_set1_epi32(1);
  const __m256i c1m = _mm256_set1_epi32(int(t.cum[1]) - 1),
                c2m = _mm256_set1_epi32(int(t.cum[2]) - 1);
  const __m256i c1 = _mm256_set1_epi32(t.cum[1]), c2 = _mm256_set1_epi32(t.cum[2]);
  const __m256i f0 = _mm256_set1_epi32(t.freq[0]), f1 = _mm256_set1_epi32(t.freq[1]),
                f2 = _mm256_set1_epi32(t.freq[2]);
  auto step = [&](__m256i& x, uint64_t at) {
    const __m256i slot = _mm256_and_si256(x, m12);
    const __m256i a = _mm256_cmpgt_epi32(slot, c1m), b = _mm256_cmpgt_epi32(slot, c2m);
    const __m256i f = _mm256_blendv_epi8(_mm256_blendv_epi8(f0, f1, a), f2, b);
    const __m256i cum = _mm256_blendv_epi8(_mm256_and_si256(c1, a), c2, b);
    x = RenormWide(_mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, kScaleBits)),
                                    _mm256_sub_epi32(slot, cum)),
                   wp, lt);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + at), _mm256_or_si256(a, one));
    AppendLanes(uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(b))), at, esc, ne, lt);
  };
  uint64_t n = 0;
  for (; n + 8 * kGroups <= k; n += 8 * kGroups) {
    step(X[0], n);
    if constexpr (kGroups == 2) step(X[kGroups - 1], n + 8);
  }
  return n;
}

// Entropy stage: parses the payload (size > 0) and decodes every stream in bulk. Returns
// false on a malformed payload. data[size, size + kReadPadding) must be readable.
inline bool DecodeStreams(const uint8_t* data, size_t size, Streams* st) {
  static_assert(kStates == 4, "States holds 4");
  const Codebook& book = Book();
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  if (size < 1 + K + 16) return false;
  st->e0 = *p++;
  uint8_t gq[K], vq[K];
  st->active = 0;
  for (int c = 0; c < K; ++c) {
    gq[c] = *p++;
    if (gq[c] != kInactive) st->active |= 1u << c;
  }
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int sh = 0; sh < 64; sh += 7) {
      if (p >= end) return false;
      const uint8_t b = *p++;
      *v |= uint64_t(b & 127) << sh;
      if (!(b & 128)) return true;
    }
    return false;
  };
  uint64_t total = 0;
  for (int c = 0; c < K; ++c) {
    st->k[c] = 0;
    st->off[c] = total;
    if (!(st->active >> c & 1)) continue;
    if (p >= end) return false;
    vq[c] = *p++;
    if (!varint(&st->k[c]) || st->k[c] == 0 || st->k[c] >= (uint64_t{1} << 26)) return false;
    total += st->k[c];
  }
  const bool wide = total >= kWideMin;
  const int nst = wide ? kWideStates : kStates;
  if (p + 4 * nst > end) return false;
  States x;
  alignas(32) uint32_t xw[kWideStates] = {0};  // the wide decoder's states between its SIMD loops
  std::memcpy(wide ? xw : x.s, p, 4 * nst);
  p += 4 * nst;
  __m256i X[kGroups];
  auto load_x = [&] {
    for (int j = 0; j < kGroups; ++j)
      X[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(xw + 8 * j));
  };
  auto store_x = [&] {
    for (int j = 0; j < kGroups; ++j)
      _mm256_store_si256(reinterpret_cast<__m256i*>(xw + 8 * j), X[j]);
  };
  load_x();
  uint64_t nwords = 0;
  if (!varint(&nwords) || nwords > uint64_t(end - p) / 2) return false;
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(p);
  const uint16_t* wend = wp + nwords;
  const uint8_t* fixed = p + 2 * nwords;
  uint64_t fixed_bits = 0;
  for (int c = 0; c < K; ++c)
    if (st->active >> c & 1) fixed_bits += st->k[c] * uint64_t(book.gap[gq[c]].sh);
  const uint8_t* serial = fixed + (fixed_bits + 7) / 8;
  if (serial > end) return false;
  const uint64_t serial_bits = uint64_t(end - serial) * 8;
  uint64_t spos = 0;
  if (st->rank.size() < total) {
    st->rank.resize(total);
    st->val.resize(total);
    st->esc.resize(total + 16);
  }
  // Words are read past the stream's end only when the payload is malformed: the decoder
  // reads at most 4 (padding) words too many before the checks below fail.
  uint64_t fpos = 0;
  for (int c = 0; c < K; ++c) {  // gaps -> ranks
    if (!(st->active >> c & 1)) continue;
    const Table& tb = book.gap[gq[c]];
    const Table* tp = &tb;
    const int sh = tb.sh;
    const uint64_t kc = st->k[c];
    uint32_t* g = st->rank.data() + st->off[c];
    uint32_t* esc = st->esc.data();
    size_t ne = 0;
    const uint64_t f0 = fpos;
    if (wide) {
      const uint64_t n0 = sh <= 24 ? GapsWide(X, wp, tb, kc, g, fixed, f0, sh, esc, ne) : 0;
      store_x();
      for (uint64_t n = n0; n < kc; ++n) {  // the rest, in the same lane order
        const uint32_t s = DecSmall<false>(xw[n % kWideStates], tb, wp);
        g[n] = s << sh | BitsAt(fixed, f0 + n * sh, sh);
        esc[ne] = uint32_t(n);
        ne += s == kEscGap;
      }
      load_x();
    } else {
      RunStream(&x, &wp, kc,
                [tp, g, esc, fixed, f0, sh, &ne](uint32_t& xs, uint64_t n, const uint16_t*& w) {
                  const uint32_t s = DecSmall<false>(xs, *tp, w);
                  g[n] = s << sh | BitsAt(fixed, f0 + n * sh, sh);
                  esc[ne] = uint32_t(n);
                  ne += s == kEscGap;
                });
    }
    fpos += kc * sh;
    if (wp > wend + kWideStates) return false;
    for (size_t e = 0; e < ne; ++e) {  // coarse >= 15: Elias-gamma excess (rare)
      if (spos > serial_bits) return false;
      uint64_t w;
      std::memcpy(&w, serial + (spos >> 3), 8);
      w >>= spos & 7;
      const int len = int(__builtin_ctzll(~w)) + 1;  // bit length of v
      if (len > 26) return false;
      spos += len;
      const uint64_t v = (uint64_t{1} << (len - 1)) | BitsAt(serial, spos, len - 1);
      spos += len - 1;
      g[esc[e]] += uint32_t((v - 1) << sh);
    }
    uint64_t r = ~uint64_t{0};  // prefix: rank = previous rank + gap + 1
    for (uint64_t q = 0; q < kc; ++q) {
      r += uint64_t(g[q]) + 1;
      g[q] = uint32_t(r);
    }
    if (r >= (uint64_t{1} << 32)) return false;
  }
  for (int c = 0; c < K; ++c) {  // values and their escapes
    if (!(st->active >> c & 1)) continue;
    const Table& tt = book.tern[vq[c] >> 4];
    const uint32_t c1 = tt.cum[1], c2 = tt.cum[2];
    const uint32_t f0 = tt.freq[0], f1 = tt.freq[1], f2 = tt.freq[2];
    const uint64_t kc = st->k[c];
    int32_t* v = st->val.data() + st->off[c];
    uint32_t* esc = st->esc.data();
    size_t ne = 0;
    auto tern = [=, &ne](uint32_t& xs, uint64_t n, const uint16_t*& w) {
      const uint32_t slot = xs & (kScale - 1);
      const uint32_t a = slot >= c1, b = slot >= c2;
      const uint32_t f = b ? f2 : a ? f1 : f0;
      const uint32_t cum = b ? c2 : a ? c1 : 0;
      xs = Renorm(f * (xs >> kScaleBits) + slot - cum, w);
      v[n] = 1 - 2 * int32_t(a);
      esc[ne] = uint32_t(n);
      ne += b;
    };
    const Table* et = &book.esc[vq[c] & 15];
    if (wide) {
      const uint64_t n0 = TernWide(X, wp, tt, kc, v, esc, ne);
      store_x();
      for (uint64_t n = n0; n < kc; ++n) tern(xw[n % kWideStates], n, wp);
      for (size_t e = 0; e < ne; ++e) esc[e] |= DecSmall<true>(xw[e % kWideStates], *et, wp) << 26;
      load_x();
    } else {
      RunStream(&x, &wp, kc, tern);
      RunStream(&x, &wp, ne, [esc, et](uint32_t& xs, uint64_t e, const uint16_t*& w) {
        esc[e] |= DecSmall<true>(xs, *et, w) << 26;
      });
    }
    if (wp > wend + kWideStates) return false;
    for (size_t e = 0; e < ne; ++e) {
      const uint32_t s = esc[e] >> 26, idx = esc[e] & ((1u << 26) - 1);
      const int j = int(s >> 1) + 1;
      if (spos + j > serial_bits) return false;
      const int32_t mag = int32_t((1u << j) | BitsAt(serial, spos, j));
      spos += j;
      v[idx] = (s & 1) ? -mag : mag;
    }
  }
  if (wide) {
    store_x();
    for (uint32_t xs : xw)
      if (xs != kL) return false;
  } else if (x.s[0] != kL || x.s[1] != kL || x.s[2] != kL || x.s[3] != kL) {
    return false;
  }
  return wp == wend;
}

// Decoder's class pass: copies base[0..n) (n <= kTile) to out and writes the tile's three
// class bit planes: bit b of u64 word pl[j * kWords + w] = bit j of the class of element
// 64 w + b (0 past n; the select tables mask those elements off). Per 32 elements: the
// class as bytes, three movemasks, three 32-bit stores, whatever K's classes hold.
inline void PlanePass(const uint16_t* base, uint16_t* out, size_t n, int e0, uint32_t* pl) {
  const __m256i vmask = _mm256_set1_epi16(0xFF), ve0 = _mm256_set1_epi16(short(e0)),
                vk = _mm256_set1_epi16(K - 1);
  alignas(32) uint16_t tmp[32];
  for (size_t i = 0; i < kTile; i += 32) {
    const uint16_t* src = base + i;
    if (i + 32 > n) {
      if (i >= n) {
        for (int j = 0; j < 3; ++j) pl[j * (kTile / 32) + i / 32] = 0;
        continue;
      }
      std::memset(tmp, 0, sizeof tmp);
      std::memcpy(tmp, base + i, 2 * (n - i));
      std::memcpy(out + i, base + i, 2 * (n - i));
      src = tmp;
    } else {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), b);
    }
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16));
    const __m256i c0 = _mm256_min_epu16(
        _mm256_subs_epu16(_mm256_and_si256(_mm256_srli_epi16(v0, 7), vmask), ve0), vk);
    const __m256i c1 = _mm256_min_epu16(
        _mm256_subs_epu16(_mm256_and_si256(_mm256_srli_epi16(v1, 7), vmask), ve0), vk);
    const __m256i cb = _mm256_permute4x64_epi64(_mm256_packus_epi16(c0, c1), 0xD8);
    pl[i / 32] = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 7)));
    pl[kTile / 32 + i / 32] = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 6)));
    pl[2 * (kTile / 32) + i / 32] = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(cb, 5)));
  }
}

// Class c's members in word x of a tile's planes (flip[j] = ~0 where bit j of c is 0).
inline uint64_t ClassWord(const uint64_t* pl, const uint64_t* flip, size_t x) {
  return (pl[x] ^ flip[0]) & (pl[kWords + x] ^ flip[1]) & (pl[2 * kWords + x] ^ flip[2]);
}

// Per-class select tables of one tile: mask[w] = the class's members in word w,
// wp[w] = members before word w, bp[b] = wp[16 b] (16 blocks of 16 words), members =
// the class's members in the tile. Prefixes are i16 (<= 16384): one 16-lane compare
// searches 16 of them.
struct SelectTables {
  alignas(32) uint64_t mask[kWords];
  alignas(32) int16_t wp[kWords];
  alignas(32) int16_t bp[16];
  uint32_t members;
};

// Builds class c's tables from the planes, 4 words per step: masks, popcounts by nibble
// lookup + psadbw, an in-register prefix. live (tile of n < kTile elements only): the
// live elements of each word.
inline void BuildSelect(const uint64_t* pl, int c, const uint64_t* live, SelectTables* t) {
  uint64_t flip[3];
  for (int j = 0; j < 3; ++j) flip[j] = (c >> j & 1) ? 0 : ~uint64_t{0};
  const __m256i f0 = _mm256_set1_epi64x(int64_t(flip[0])),
                f1 = _mm256_set1_epi64x(int64_t(flip[1]));
  const __m256i f2 = _mm256_set1_epi64x(int64_t(flip[2]));
  const __m256i nib = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2,
                                       1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i low4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
  const __m256i hi_lanes = _mm256_setr_epi64x(0, 0, -1, -1);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  __m256i run = zero;
  for (size_t x = 0; x < kWords; x += 4) {
    __m256i m = _mm256_and_si256(
        _mm256_and_si256(
            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(pl + x)), f0),
            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(pl + kWords + x)),
                             f1)),
        _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(pl + 2 * kWords + x)),
                         f2));
    if (live)
      m = _mm256_and_si256(m, _mm256_load_si256(reinterpret_cast<const __m256i*>(live + x)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(t->mask + x), m);
    const __m256i cnt8 =
        _mm256_add_epi8(_mm256_shuffle_epi8(nib, _mm256_and_si256(m, low4)),
                        _mm256_shuffle_epi8(nib, _mm256_and_si256(_mm256_srli_epi16(m, 4), low4)));
    const __m256i cnt = _mm256_sad_epu8(cnt8, zero);                      // 4 x u64 counts
    const __m256i s1 = _mm256_add_epi64(cnt, _mm256_slli_si256(cnt, 8));  // [a, a+b | c, c+d]
    const __m256i s2 =
        _mm256_add_epi64(s1, _mm256_and_si256(_mm256_permute4x64_epi64(s1, 0x55), hi_lanes));
    const __m256i excl = _mm256_add_epi64(_mm256_sub_epi64(s2, cnt), run);
    run = _mm256_add_epi64(run, _mm256_permute4x64_epi64(s2, 0xFF));
    const __m128i e32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(excl, pick));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(t->wp + x), _mm_packus_epi32(e32, e32));
  }
  for (int b = 0; b < 16; ++b) t->bp[b] = t->wp[16 * b];
  t->members = uint32_t(_mm256_extract_epi64(run, 0));
}

// Member rank r (< members) -> element index in the tile: block by one 16-lane compare,
// word by another, bit by pdep; no branch.
inline uint32_t Select(const SelectTables& t, uint32_t r) {
  const __m256i vr = _mm256_set1_epi16(short(r));
  const uint32_t gb = uint32_t(_mm256_movemask_epi8(
      _mm256_cmpgt_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.bp)), vr)));
  const uint32_t b =
      15 - uint32_t(_mm_popcnt_u32(gb)) / 2;  // blocks starting at or before r, less one
  const uint32_t gw = uint32_t(_mm256_movemask_epi8(
      _mm256_cmpgt_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(t.wp + 16 * b)), vr)));
  const uint32_t x = 16 * b + 15 - uint32_t(_mm_popcnt_u32(gw)) / 2;
  const uint64_t bit = _pdep_u64(uint64_t{1} << (r - uint32_t(t.wp[x])), t.mask[x]);
  return 64 * x + uint32_t(_tzcnt_u64(bit));
}

// The other select (SPEED.md's "expand"), for comparison: per class and word, the class
// mask's popcount m, the next m bits of the class's rank bitset R deposited (pdep) on the
// mask and ORed into the tile's change bitmap M; then M -> positions by a tzcnt loop, and
// each change takes the next value of its class's stream (a merge by class counters).
struct ExpandScratch {
  alignas(32) uint64_t r[kWords + 2];  // rank bitset of one class in one tile (+2: funnel reads)
  alignas(32) uint64_t m[kWords];      // changes of the tile
};

enum Mode {
  kPassOnly = 0,
  kStreamsOnly = 1,
  kNoApply = 2,
  kFull = 3,
  kNoSelect = 4,
  kExpandNoScan = 5
};
enum SelectKind { kSelect2 = 0, kExpand = 1 };

// Decodes into out (count elements) from base; data[size, size + kReadPadding) must be
// readable. With kHash, streams out through XXH3-64 tile by tile (right after the tile is
// written) and compares with `checksum`. Returns false on a malformed payload or a wrong
// checksum. Timing modes (wrong output): kPassOnly = class pass + copy (+ hash),
// kStreamsOnly = the entropy stage alone, kNoSelect = entropy + class pass + select
// tables, kNoApply = everything but the patch (positions summed into *sink); with kExpand,
// kExpandNoScan = entropy + class pass + expand into M (no positions, no patch).
template <Mode kMode, bool kHash, SelectKind kSel = kSelect2>
inline bool Decode(const uint16_t* base, size_t count, const uint8_t* data, size_t size,
                   uint16_t* out, uint64_t checksum, XXH3_state_t* hs, Streams* st,
                   uint64_t* sink = nullptr) {
  if (kHash) XXH3_64bits_reset(hs);
  const size_t tiles = (count + kTile - 1) / kTile;
  alignas(64) static thread_local uint32_t pl32[3 * (kTile / 32)];
  alignas(64) static thread_local uint64_t live[kWords];
  alignas(64) static thread_local SelectTables sel[K];
  alignas(64) static thread_local ExpandScratch ex;
  if (size == 0) {
    if (kMode == kStreamsOnly) return true;
    for (size_t t = 0; t < tiles; ++t) {
      const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
      std::memcpy(out + t0, base + t0, 2 * n);
      if (kHash) XXH3_64bits_update(hs, out + t0, 2 * n);
    }
    return !kHash || XXH3_64bits_digest(hs) == checksum;
  }
  if (kMode == kPassOnly) {
    for (size_t t = 0; t < tiles; ++t) {
      const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
      PlanePass(base + t0, out + t0, n, data[0], pl32);
      if (kHash) XXH3_64bits_update(hs, out + t0, 2 * n);
    }
    return !kHash || XXH3_64bits_digest(hs) == checksum;
  }
  if (!DecodeStreams(data, size, st)) return false;
  if (kMode == kStreamsOnly) return true;
  uint64_t idx[K], end[K], rank_base[K] = {0};
  for (int c = 0; c < K; ++c) {
    idx[c] = st->off[c];
    end[c] = st->off[c] + st->k[c];
  }
  const uint32_t* rank = st->rank.data();
  const int32_t* val = st->val.data();
  uint64_t acc = 0;
  unsigned pending = st->active;  // classes with changes left: the others need no tables
  for (size_t t = 0; t < tiles; ++t) {
    const size_t t0 = t * kTile, n = std::min(kTile, count - t0);
    if (!pending) {  // every change applied: the rest of the tensor is a copy
      std::memcpy(out + t0, base + t0, 2 * n);
      if (kHash) XXH3_64bits_update(hs, out + t0, 2 * n);
      continue;
    }
    PlanePass(base + t0, out + t0, n, st->e0, pl32);
    const uint64_t* pl = reinterpret_cast<const uint64_t*>(pl32);
    const uint64_t* lv = nullptr;
    if (n < kTile) {
      for (size_t x = 0; x < kWords; ++x)
        live[x] = 64 * x + 64 <= n ? ~uint64_t{0}
                  : 64 * x >= n    ? 0
                                   : _bzhi_u64(~uint64_t{0}, unsigned(n - 64 * x));
      lv = live;
    }
    const uint16_t* tb = base + t0;
    uint16_t* to = out + t0;
    if (kSel == kSelect2) {
      for (int c = 0; c < K; ++c) {
        if (!(pending >> c & 1)) continue;
        SelectTables& s = sel[c];
        BuildSelect(pl, c, lv, &s);
        const uint64_t lim = rank_base[c] + s.members;
        uint64_t q = idx[c];
        const uint64_t e = end[c];
        // The class's changes in this tile; the loop branch mispredicts once per tile and
        // class, not once per change.
        if (kMode == kNoSelect) {
          for (; q < e && rank[q] < lim; ++q) acc += rank[q];
        }
        for (; q < e && rank[q] < lim; ++q) {
          const uint32_t i = Select(s, uint32_t(rank[q] - rank_base[c]));
          if (kMode == kFull)
            to[i] = Apply(tb[i], val[q]);
          else
            acc += i;
        }
        idx[c] = q;
        rank_base[c] = lim;
        if (q == e) pending &= ~(1u << c);
      }
    } else {
      std::memset(ex.m, 0, sizeof ex.m);
      uint64_t first[K];
      for (int c = 0; c < K; ++c) {
        first[c] = idx[c];
        if (!(pending >> c & 1)) continue;
        uint64_t flip[3];
        for (int j = 0; j < 3; ++j) flip[j] = (c >> j & 1) ? 0 : ~uint64_t{0};
        // R: ranks below rank_base + kTile (a superset of the tile's; the extra bits lie
        // past the class's members and are never deposited).
        const uint64_t rb = rank_base[c];
        uint64_t q = idx[c];
        const uint64_t e = end[c];
        for (; q < e && rank[q] < rb + kTile; ++q) {
          const uint32_t r = uint32_t(rank[q] - rb);
          ex.r[r >> 6] |= uint64_t{1} << (r & 63);
        }
        const uint64_t q_hi = q;
        uint64_t off = 0;
        for (size_t x = 0; x < kWords; ++x) {
          uint64_t m = ClassWord(pl, flip, x);
          if (lv) m &= lv[x];
          const uint64_t lo = ex.r[off >> 6] >> (off & 63);
          const uint64_t hi = (ex.r[(off >> 6) + 1] << 1)
                              << (63 - (off & 63));  // 0 when off % 64 == 0
          ex.m[x] |= _pdep_u64(lo | hi, m);
          off += uint64_t(_mm_popcnt_u64(m));
        }
        for (q = idx[c]; q < q_hi; ++q) ex.r[(rank[q] - rb) >> 6] = 0;
        for (q = idx[c]; q < e && rank[q] < rb + off; ++q) {}
        idx[c] = q;
        rank_base[c] = rb + off;
        if (q == e) pending &= ~(1u << c);
      }
      if (kMode == kExpandNoScan) {
        for (size_t x = 0; x < kWords; ++x) acc += ex.m[x];
      } else {
        // Positions in element order (tzcnt loop); each change takes the next value of its
        // class (the class of its base element).
        const int e0 = st->e0;
        for (size_t x = 0; x < kWords; ++x) {
          for (uint64_t mm = ex.m[x]; mm; mm = _blsr_u64(mm)) {
            const uint32_t i = uint32_t(64 * x + _tzcnt_u64(mm));
            const uint16_t b = tb[i];
            const int c = ClassOf(b, e0);
            const int32_t d = val[first[c]++];
            if (kMode == kFull)
              to[i] = Apply(b, d);
            else
              acc += i;
          }
        }
        for (int c = 0; c < K; ++c)
          if (first[c] != idx[c]) return false;
      }
    }
    if (kHash) XXH3_64bits_update(hs, to, 2 * n);
  }
  if (sink) *sink += acc;
  for (int c = 0; c < K; ++c)
    if (idx[c] != end[c]) return false;
  return !kHash || XXH3_64bits_digest(hs) == checksum;
}

// ---------------------------------------------------------------- benchmark data
// The generated regimes of bench/arc_bench.cc (its --regimes low, mid, high), as in
// bench/prototypes/class_gap/class_gap.h.
struct RegimeSpec {
  const char* name;
  double density;
};
constexpr RegimeSpec kRegimes[3] = {{"gen_low", 0.002}, {"gen_mid", 0.02}, {"gen_high", 0.10}};
constexpr uint64_t kDefaultParams = 4'000'000;
constexpr int kDefaultDeltas = 2;

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

}  // namespace bulk_decode
}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_PROTOTYPES_BULK_DECODE_BULK_DECODE_H_

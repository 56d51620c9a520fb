// See xxh3_forge.h. The model of XXH3-64 below follows xxHash 0.8's scalar code for 17 to
// 240 bytes; ForgeXxh3 checks every result against the library's XXH3_64bits, so a model
// that drifted from the library gives "" (a failing test), never a wrong forgery.
#include "tests/sync/xxh3_forge.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace arc_v3 {
namespace sync {
namespace test {
namespace {

uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only, as the tests run
  return v;
}

uint64_t Mix16(const uint8_t* input, const uint8_t* secret) {
  const __uint128_t product = static_cast<__uint128_t>(Read64(input) ^ Read64(secret)) *
                              (Read64(input + 8) ^ Read64(secret + 8));
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

// One mix16 term of the hash: 16 input bytes at `at`, the secret at `secret`, added to the
// sum of group 0 (before the middle avalanche of 129..240 bytes) or group 1 (after it).
struct Term {
  size_t at, secret;
  int group;
};

std::vector<Term> Terms(size_t len) {
  std::vector<Term> terms;
  if (len <= 128) {
    if (len > 96) terms.insert(terms.end(), {{48, 96, 0}, {len - 64, 112, 0}});
    if (len > 64) terms.insert(terms.end(), {{32, 64, 0}, {len - 48, 80, 0}});
    if (len > 32) terms.insert(terms.end(), {{16, 32, 0}, {len - 32, 48, 0}});
    terms.insert(terms.end(), {{0, 0, 0}, {len - 16, 16, 0}});
    return terms;
  }
  for (size_t i = 0; i < 8; ++i) terms.push_back({16 * i, 16 * i, 0});
  for (size_t i = 8; i < len / 16; ++i) terms.push_back({16 * i, 16 * (i - 8) + 3, 1});
  terms.push_back({len - 16, 136 - 17, 1});
  return terms;
}

// Terms that share input bytes vary together: a component is a set of terms closed under
// overlap, whose sum depends on its bytes alone.
struct Component {
  std::vector<Term> terms;
  std::set<int> groups;
  std::vector<size_t> free;  // free positions inside it
  uint64_t Sum(const std::string& text) const {
    uint64_t s = 0;
    for (const Term& t : terms) {
      s += Mix16(reinterpret_cast<const uint8_t*>(text.data()) + t.at, XXH3_kSecret + t.secret);
    }
    return s;
  }
};

std::vector<Component> Components(size_t len) {
  std::vector<Component> parts;
  for (const Term& t : Terms(len)) {
    Component merged;
    merged.terms.push_back(t);
    for (auto it = parts.begin(); it != parts.end();) {
      const bool overlaps = std::any_of(it->terms.begin(), it->terms.end(), [&](const Term& u) {
        return u.at < t.at + 16 && t.at < u.at + 16;
      });
      if (overlaps) {
        merged.terms.insert(merged.terms.end(), it->terms.begin(), it->terms.end());
        it = parts.erase(it);
      } else {
        ++it;
      }
    }
    parts.push_back(merged);
  }
  for (Component& c : parts) {
    for (const Term& t : c.terms) c.groups.insert(t.group);
  }
  return parts;
}

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Candidate `index` of component `c`: its free positions filled from `alphabet`, the same
// characters whenever asked again (so lists hold values only).
void Fill(const Component& c, uint64_t seed, uint32_t index, const std::string& alphabet,
          std::string* text) {
  uint64_t state = seed ^ (static_cast<uint64_t>(index) << 20) ^ (index * 0x2545F4914F6CDD1Dull);
  for (size_t p : c.free) (*text)[p] = alphabet[SplitMix(&state) % alphabet.size()];
}

struct Pair {
  uint64_t sum;
  uint32_t a, b;
  bool operator<(const Pair& o) const { return sum < o.sum; }
};

// Pairs (a, b) of two lists whose sum's low `bits` bits are `low`.
std::vector<Pair> Join(const std::vector<uint64_t>& x, const std::vector<uint64_t>& y, int bits,
                       uint64_t low) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  std::vector<std::pair<uint64_t, uint32_t>> by_low(y.size());
  for (uint32_t j = 0; j < y.size(); ++j) by_low[j] = {y[j] & mask, j};
  std::sort(by_low.begin(), by_low.end());
  std::vector<Pair> pairs;
  pairs.reserve(x.size() * 2);
  for (uint32_t i = 0; i < x.size(); ++i) {
    const uint64_t need = (low - x[i]) & mask;
    auto it = std::lower_bound(by_low.begin(), by_low.end(), std::make_pair(need, uint32_t{0}));
    for (; it != by_low.end() && it->first == need; ++it)
      pairs.push_back({x[i] + y[it->second], i, it->second});
  }
  return pairs;
}

}  // namespace

std::vector<size_t> PositionsOf(const std::string& text, const std::string& opening) {
  std::vector<size_t> at;
  const size_t start = text.find(opening);
  if (start == std::string::npos) return at;
  for (size_t p = start + opening.size(); p < text.size() && text[p] != '"'; ++p) at.push_back(p);
  return at;
}

std::string ForgeXxh3(const std::string& genuine, const std::string& wanted,
                      const std::vector<size_t>& free, const std::string& alphabet) {
  const size_t len = genuine.size();
  if (wanted.size() != len || len <= 16 || len > 240 || alphabet.empty()) return "";
  std::vector<Component> parts = Components(len);
  const std::set<size_t> is_free(free.begin(), free.end());
  // The sums of the two groups (one for up to 128 bytes), of components within one group.
  uint64_t target[2] = {0, 0}, have[2] = {0, 0};
  for (const Component& c : parts) {
    const int g = *c.groups.begin();
    if (c.groups.size() == 1) {
      target[g] += c.Sum(genuine);
      have[g] += c.Sum(wanted);
    }
  }
  for (const Component& c : parts) {
    if (c.groups.size() > 1 && c.Sum(wanted) != c.Sum(genuine))
      return "";  // spans both sums: keep it
  }
  // The group searched: the one where `wanted` differs (group 0 if none); the other must match.
  if (have[0] != target[0] && have[1] != target[1]) return "";
  const int search = have[0] != target[0] ? 0 : have[1] != target[1] ? 1 : 0;
  // The four components of the searched group with the most free bytes; the others fixed.
  std::vector<Component*> chosen;
  for (Component& c : parts) {
    if (c.groups.size() != 1 || *c.groups.begin() != search) continue;
    for (const Term& t : c.terms) {
      for (size_t p = t.at; p < t.at + 16; ++p) {
        if (is_free.count(p) && std::find(c.free.begin(), c.free.end(), p) == c.free.end())
          c.free.push_back(p);
      }
    }
    if (c.free.size() >= 4) chosen.push_back(&c);
  }
  std::sort(chosen.begin(), chosen.end(),
            [](const Component* a, const Component* b) { return a->free.size() > b->free.size(); });
  if (chosen.size() < 4) return "";
  chosen.resize(4);
  // R: what the four must add up to.
  uint64_t rest = have[search];
  for (Component* c : chosen) rest -= c->Sum(wanted);
  const uint64_t R = target[search] - rest;
  constexpr uint32_t kList = 1u << 21;
  constexpr int kBits = 20;
  std::string text = wanted;
  for (uint64_t attempt = 0; attempt < 8; ++attempt) {
    const uint64_t seed = 0x5EEDull * (attempt + 1);
    std::vector<std::vector<uint64_t>> lists(4, std::vector<uint64_t>(kList));
    for (int l = 0; l < 4; ++l) {
      std::string scratch = wanted;
      for (uint32_t i = 0; i < kList; ++i) {
        Fill(*chosen[l], seed + l, i, alphabet, &scratch);
        lists[l][i] = chosen[l]->Sum(scratch);
      }
    }
    std::vector<Pair> left = Join(lists[0], lists[1], kBits, 0);
    const std::vector<Pair> right = Join(lists[2], lists[3], kBits, R);
    std::sort(left.begin(), left.end());
    for (const Pair& r : right) {
      const auto it = std::lower_bound(left.begin(), left.end(), Pair{R - r.sum, 0, 0});
      if (it == left.end() || it->sum != R - r.sum) continue;
      Fill(*chosen[0], seed + 0, it->a, alphabet, &text);
      Fill(*chosen[1], seed + 1, it->b, alphabet, &text);
      Fill(*chosen[2], seed + 2, r.a, alphabet, &text);
      Fill(*chosen[3], seed + 3, r.b, alphabet, &text);
      if (text != genuine &&
          XXH3_64bits(text.data(), text.size()) == XXH3_64bits(genuine.data(), genuine.size())) {
        return text;
      }
    }
  }
  return "";
}

}  // namespace test
}  // namespace sync
}  // namespace arc_v3

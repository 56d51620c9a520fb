// Fuzz target: every SIMD kernel on every compiled target against its reference
// (src/codec/ref_kernels.cc), byte for byte, on fuzzer-chosen data, lengths and misalignments.
// Outputs live in exactly-sized heap blocks so that ASan sees any write past them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "hwy/targets.h"
#include "src/codec/kernels.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

// A heap block of exactly `n` T's starting `misalign` elements into an allocation of
// n + misalign, so that the end is the allocation's end.
template <class T>
class Exact {
 public:
  Exact(size_t n, size_t misalign) : block_(new T[n + misalign]), data_(block_.get() + misalign) {}
  T* data() { return data_; }

 private:
  std::unique_ptr<T[]> block_;
  T* data_;
};

int FuzzKernels(const uint8_t* data, size_t size) {
  Consumer in(data, size);
  const uint8_t control = in.Byte();
  const size_t misalign = control & 7;
  // Low bits of control pick how dense the XORs are: the rest of the input is XOR masks.
  const uint16_t keep_mask = (control & 0x08) ? 0x007F : 0xFFFF;
  size_t rest_size;
  const uint8_t* rest = in.Rest(&rest_size);
  const size_t n = rest_size / 2;
  std::vector<uint16_t> src(n), dst(n), xors_in(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t x = static_cast<uint16_t>(rest[2 * i] | (rest[2 * i + 1] << 8));
    if ((control & 0x10) && (x & 0x0F00)) x = 0;  // sparse
    x &= keep_mask;
    src[i] = BaseValue(i);
    dst[i] = src[i] ^ x;
    xors_in[i] = x;
  }

  const ChangeCounts want = ref::ClassifyChanges(src.data(), dst.data(), n);
  std::vector<uint32_t> want_pos(want.changed);
  std::vector<uint16_t> want_xor(want.changed);
  FUZZ_CHECK(ref::CompactChanges(src.data(), dst.data(), n, want_pos.data(), want_xor.data()) ==
                 want.changed,
             "reference compaction count");
  std::vector<uint8_t> want_packed(PackedMantissaBytes(n));
  ref::PackMantissas(xors_in.data(), n, want_packed.data());
  std::vector<uint16_t> want_unpacked(n);
  ref::UnpackMantissas(want_packed.data(), n, want_unpacked.data());
  std::vector<uint16_t> want_applied(n);
  ref::ApplyXor(src.data(), xors_in.data(), n, want_applied.data());
  const size_t groups = n / 4;
  // A session history from the input's high bytes, boosts and the rate cap from its last
  // bytes.
  std::vector<uint8_t> history(n);
  for (size_t i = 0; i < n; ++i) history[i] = rest[2 * i + 1];
  int8_t boosts[8];
  for (size_t k = 0; k < 8; ++k) {
    boosts[k] = static_cast<int8_t>(k < rest_size ? rest[rest_size - 1 - k] : 0);
  }
  const int rate_cap = rest_size > 8 ? rest[rest_size - 9] % (kMaxRateLog + 1) : kMaxRateLog;
  std::vector<uint64_t> want_rates(groups);
  const int want_largest = ref::GroupRateSums(dst.data(), groups, rate_cap, want_rates.data());
  std::vector<uint64_t> want_history_rates(groups);
  ref::HistoryRateSums(dst.data(), history.data(), boosts, groups, rate_cap,
                       want_history_rates.data());
  std::vector<uint32_t> want_recent(n);
  const size_t want_recent_count = ref::RecentPositions(history.data(), n, want_recent.data());
  std::vector<uint8_t> want_history = history;
  ref::AdvanceHistory(src.data(), dst.data(), n, want_history.data());
  // rANS change flags: probabilities from the input's low bytes, states from its first
  // bytes, the input itself as words (every byte string is a valid input). An odd input
  // size codes with the history above (tables for each history class).
  const uint8_t* rans_history = (rest_size & 1) != 0 ? history.data() : nullptr;
  uint32_t probs[kRansTables], splits[kRansTables];
  for (size_t c = 0; c < kRansTables; ++c) {
    probs[c] = 3 + (c < rest_size ? uint32_t{rest[c]} * 257 % 65533 : 4096);
    const uint32_t a = 1 + (c + 1 < rest_size ? rest[c + 1] : 7u) % (probs[c] - 2);
    splits[c] = a | ((a + 1 + (probs[c] - a - 2) / 2) << 16);
  }
  const int class_base = 100 + (control >> 5) * 4;  // the base values' exponents span it
  // The rANS element encoder on src -> dst with the same tables.
  uint32_t want_encoder_states[kRansLanes];
  for (size_t l = 0; l < kRansLanes; ++l) want_encoder_states[l] = kRansLow + 977 * l;
  std::vector<uint16_t> want_pushed(n + kRansLanes);
  const size_t want_pushed_count =
      ref::EncodeRansElements(src.data(), dst.data(), n, class_base, probs, splits,
                              want_encoder_states, want_pushed.data(), rans_history);
  uint32_t start_states[kRansLanes];
  for (size_t l = 0; l < kRansLanes; ++l) {
    start_states[l] =
        kRansLow | (l < n ? dst[l] : 0x1234u) | (uint32_t{rest_size > l ? rest[l] : 0u} << 24);
  }
  uint32_t want_states[kRansLanes];
  std::copy(start_states, start_states + kRansLanes, want_states);
  std::vector<uint32_t> want_flags(n + kRansLanes), want_flag_xors(n + kRansLanes);
  size_t want_words_used = 0;
  const size_t want_flag_count = ref::DecodeRansChanges(
      src.data(), n, class_base, probs, splits, want_states, rest, rest_size / 2, &want_words_used,
      want_flags.data(), want_flag_xors.data(), rans_history);

  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const char* name = hwy::TargetName(target);
    // Inputs also in exact, misaligned blocks.
    Exact<uint16_t> s(n, misalign), d(n, misalign), x(n, misalign);
    if (n > 0) {
      std::memcpy(s.data(), src.data(), n * 2);
      std::memcpy(d.data(), dst.data(), n * 2);
      std::memcpy(x.data(), xors_in.data(), n * 2);
    }

    const ChangeCounts got = ClassifyChanges(s.data(), d.data(), n);
    FUZZ_CHECK(got.changed == want.changed && got.high == want.high, name);

    Exact<uint32_t> pos(want.changed, misalign);
    Exact<uint16_t> cx(want.changed, misalign);
    FUZZ_CHECK(CompactChanges(s.data(), d.data(), n, pos.data(), cx.data()) == want.changed, name);
    for (size_t k = 0; k < want.changed; ++k) {
      FUZZ_CHECK(pos.data()[k] == want_pos[k] && cx.data()[k] == want_xor[k], name);
    }

    const size_t packed_size = PackedMantissaBytes(n);
    Exact<uint8_t> packed(packed_size, misalign);
    PackMantissas(x.data(), n, packed.data());
    FUZZ_CHECK(packed_size == 0 || std::memcmp(packed.data(), want_packed.data(), packed_size) == 0,
               name);

    // Unpack arbitrary packed bytes (the input itself), not only packed ones.
    Exact<uint8_t> raw(packed_size, misalign);
    if (packed_size > 0) std::memcpy(raw.data(), rest, std::min(packed_size, rest_size));
    std::vector<uint16_t> want_raw_unpacked(n);
    ref::UnpackMantissas(raw.data(), n, want_raw_unpacked.data());
    Exact<uint16_t> unpacked(n, misalign);
    UnpackMantissas(raw.data(), n, unpacked.data());
    FUZZ_CHECK(n == 0 || std::memcmp(unpacked.data(), want_raw_unpacked.data(), n * 2) == 0, name);
    UnpackMantissas(want_packed.data(), n, unpacked.data());
    FUZZ_CHECK(n == 0 || std::memcmp(unpacked.data(), want_unpacked.data(), n * 2) == 0, name);

    Exact<uint64_t> rates(groups, misalign);
    FUZZ_CHECK(GroupRateSums(d.data(), groups, rate_cap, rates.data()) == want_largest, name);
    FUZZ_CHECK(groups == 0 || std::memcmp(rates.data(), want_rates.data(), groups * 8) == 0, name);

    Exact<uint8_t> h(n, misalign);
    if (n > 0) std::memcpy(h.data(), history.data(), n);
    HistoryRateSums(d.data(), h.data(), boosts, groups, rate_cap, rates.data());
    FUZZ_CHECK(groups == 0 || std::memcmp(rates.data(), want_history_rates.data(), groups * 8) == 0,
               name);
    Exact<uint32_t> recent(n, misalign);
    FUZZ_CHECK(RecentPositions(h.data(), n, recent.data()) == want_recent_count, name);
    FUZZ_CHECK(want_recent_count == 0 ||
                   std::memcmp(recent.data(), want_recent.data(), want_recent_count * 4) == 0,
               name);
    AdvanceHistory(s.data(), d.data(), n, h.data());
    FUZZ_CHECK(n == 0 || std::memcmp(h.data(), want_history.data(), n) == 0, name);

    uint32_t states[kRansLanes];
    std::copy(start_states, start_states + kRansLanes, states);
    Exact<uint32_t> flags(n + kRansLanes, misalign), flag_xors(n + kRansLanes, misalign);
    size_t words_used = 0;
    // The history, misaligned like the other inputs.
    Exact<uint8_t> rh(n, misalign);
    if (n > 0) std::memcpy(rh.data(), history.data(), n);
    const uint8_t* hist = rans_history != nullptr ? rh.data() : nullptr;
    const size_t flag_count =
        DecodeRansChanges(s.data(), n, class_base, probs, splits, states, rest, rest_size / 2,
                          &words_used, flags.data(), flag_xors.data(), hist);
    FUZZ_CHECK(flag_count == want_flag_count, name);
    if (flag_count != kRansWordsExhausted) {
      FUZZ_CHECK(
          words_used == want_words_used && std::equal(states, states + kRansLanes, want_states) &&
              std::equal(flags.data(), flags.data() + flag_count, want_flags.begin()) &&
              std::equal(flag_xors.data(), flag_xors.data() + flag_count, want_flag_xors.begin()),
          name);
    }

    uint32_t encoder_states[kRansLanes];
    for (size_t l = 0; l < kRansLanes; ++l) encoder_states[l] = kRansLow + 977 * l;
    Exact<uint16_t> pushed(n + kRansLanes, misalign);
    FUZZ_CHECK(
        EncodeRansElements(s.data(), d.data(), n, class_base, probs, splits, encoder_states,
                           pushed.data(), hist) == want_pushed_count &&
            std::equal(encoder_states, encoder_states + kRansLanes, want_encoder_states) &&
            std::equal(pushed.data(), pushed.data() + want_pushed_count, want_pushed.begin()),
        name);

    Exact<uint16_t> applied(n, misalign);
    ApplyXor(s.data(), x.data(), n, applied.data());
    FUZZ_CHECK(n == 0 || std::memcmp(applied.data(), want_applied.data(), n * 2) == 0, name);
    ApplyXor(s.data(), x.data(), n, s.data());  // in place
    FUZZ_CHECK(n == 0 || std::memcmp(s.data(), want_applied.data(), n * 2) == 0, name);
  }
  hwy::SetSupportedTargetsForTest(0);
  return 0;
}

}  // namespace fuzz
}  // namespace arc_v3

ARC_V3_FUZZ_ENTRY(arc_v3::fuzz::FuzzKernels)

// Fuzz target: arbitrary bytes as a payload (any format version) against a fixed base.
// Promises checked: no crash or out-of-bounds access (ASan/UBSan), `out` untouched on
// every error (out of place and in place), the structural decoders agree (delta_stats
// succeeds exactly when delta_decompress fails only on the checksum), and the result does
// not depend on the thread count. Session payloads: delta_decompress refuses them, and a
// fresh arc_v3::Session and one primed with a step that ends on the base (so that payloads
// continuing it reach their chunks) decode them (a group: DecompressTensors)
// with the same promises, their state unchanged on error. Groups of tensors: see
// FuzzTensorsDecode.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "arc_v3.hpp"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

// Bigger payload headers are rejected before decoding; keeps each run fast.
constexpr uint64_t kMaxElements = uint64_t{1} << 16;

// Decodes a session payload through `session` (a group through DecompressTensors with
// `list`): success only with a matching result; on error `out` (n + 1 sentinels) and the
// session's state are untouched.
void CheckSessionDecode(Session* session, const std::vector<uint16_t>& src, bool group,
                        const std::vector<uint64_t>& list, const uint8_t* data, size_t size,
                        uint64_t checksum, std::vector<uint16_t>* out) {
  const size_t n = src.size();
  const uint64_t steps = session->steps(), history_id = session->history_id();
  Status decoded;
  if (group) {
    std::vector<TensorOut> tensors;
    size_t at = 0;
    for (const uint64_t count : list) {
      FUZZ_CHECK(count <= n - at, "tensor counts exceed the element count (session)");
      tensors.push_back({src.data() + at, out->data() + at, count});
      at += count;
    }
    decoded = session->DecompressTensors(tensors.data(), tensors.size(), data, size, checksum);
  } else {
    decoded = session->Decompress(src.data(), n, data, size, checksum, out->data());
  }
  FUZZ_CHECK(!decoded.ok() || n == 0 || Checksum(out->data(), n) == checksum,
             "session reported success with a result that does not match the checksum");
  if (!decoded.ok()) {
    for (const uint16_t v : *out) FUZZ_CHECK(v == 0xBEEF, "out written on error (session)");
    FUZZ_CHECK(session->steps() == steps && session->history_id() == history_id,
               "session state changed by a failed decode");
  }
  FUZZ_CHECK((*out)[n] == 0xBEEF, "write past count (session)");
}

// The tensor list a group is decoded with: the frame holds only Tensor_Count and a check
// of the list, so the split the seeds are made with (GroupSplit) where the count is 3,
// else all elements in the first tensor (at most 64 tensors: a larger count is refused for
// the list anyway).
std::vector<uint64_t> TensorList(const PayloadInfo& info) {
  if (info.tensor_count == 0) return {};
  if (info.tensor_count == 3) return GroupSplit(static_cast<size_t>(info.element_count));
  std::vector<uint64_t> list(std::min<uint64_t>(info.tensor_count, 64), 0);
  list[0] = info.element_count;
  return list;
}

// A receiver that has decoded the priming step (fuzz_common.h), which ends on the fixed
// base of n elements.
void PrimeReceiver(size_t n, bool group, Session* receiver) {
  // The sender's payloads by (n, group), kept for the next inputs of the same size.
  static auto* const payloads = new std::map<std::pair<size_t, bool>, Delta>();
  if (payloads->size() > 64) payloads->clear();
  Delta& delta = (*payloads)[{n, group}];
  if (delta.bytes.empty()) {
    Session sender(SeedOptions());
    CompressPrimingStep(n, group, &sender, &delta);
  }
  const std::vector<uint16_t> before = MakePrimingBase(n);
  std::vector<uint16_t> after(n);
  Status status;
  if (group) {
    const std::vector<TensorOut> tensors = GroupViews<TensorOut>(n, before.data(), after.data());
    status = receiver->DecompressTensors(tensors.data(), tensors.size(), delta.bytes.data(),
                                         delta.bytes.size(), delta.checksum);
  } else {
    status = receiver->Decompress(before.data(), n, delta.bytes.data(), delta.bytes.size(),
                                  delta.checksum, after.data());
  }
  FUZZ_CHECK(status.ok(), "the primed receiver decodes the priming step");
}

// `out` holds n + 1 sentinels.
int FuzzSessionDecode(const std::vector<uint16_t>& src, const PayloadInfo& info,
                      const uint8_t* data, size_t size, uint64_t checksum,
                      std::vector<uint16_t>* out) {
  const size_t n = src.size();
  const Status plain = delta_decompress(src.data(), n, data, size, checksum, out->data(), n, 1);
  FUZZ_CHECK(!plain.ok(), "delta_decompress accepted a session payload");
  // A session over a group of tensors decodes through DecompressTensors.
  const bool group = (data[5] & 2) != 0;
  Options options;
  options.threads = 1;
  // A fresh session: only a payload that starts a session can decode.
  Session fresh(options);
  CheckSessionDecode(&fresh, src, group, TensorList(info), data, size, checksum, out);
  // A session one step further, which ended on the fixed base: a payload that continues
  // that step decodes with its history, carried models and, for a group, its
  // tensor list.
  Session primed(options);
  PrimeReceiver(n, group, &primed);
  std::fill(out->begin(), out->end(), 0xBEEF);
  CheckSessionDecode(&primed, src, group, info.continues ? GroupSplit(n) : TensorList(info), data,
                     size, checksum, out);
  return 0;
}

// A frame of several tensors (version 6): delta_decompress refuses it; the tensor calls
// decode it into outputs back to back (in place) and scattered (copied), with the same
// promises as one tensor. From version 10 the list is TensorList's, which the frame's
// check may refuse (size_mismatch, which delta_stats cannot see).
int FuzzTensorsDecode(const std::vector<uint16_t>& src, const PayloadInfo& info,
                      const uint8_t* data, size_t size, uint64_t checksum, bool stats_ok,
                      std::vector<uint16_t>* out) {
  const size_t n = src.size();
  // Refused: for the list (size_mismatch), or for a broken chunk table found before it.
  const Status plain = delta_decompress(src.data(), n, data, size, checksum, out->data(), n, 1);
  FUZZ_CHECK(!plain.ok(), "delta_decompress accepted a group");
  for (const uint16_t v : *out) FUZZ_CHECK(v == 0xBEEF, "out written on error (one-tensor call)");
  std::vector<TensorOut> back_to_back, scattered;
  std::vector<std::vector<uint16_t>> parts;
  size_t at = 0;
  for (const uint64_t count : TensorList(info)) {
    FUZZ_CHECK(count <= n - at, "tensor counts exceed the element count");
    back_to_back.push_back({src.data() + at, out->data() + at, count});
    parts.emplace_back(count + 1, 0xBEEF);
    scattered.push_back({src.data() + at, parts.back().data(), count});
    at += count;
  }
  // A list of no tensors cannot hold the frame's elements: refused below.
  const Status one_thread =
      delta_decompress_tensors(back_to_back.data(), back_to_back.size(), data, size, checksum, 1);
  FUZZ_CHECK(!one_thread.ok() || n == 0 || Checksum(out->data(), n) == checksum,
             "reported success with a result that does not match the checksum (group)");
  FUZZ_CHECK(!one_thread.ok() || at == n, "a list short of the element count accepted");
  if (!one_thread.ok()) {
    for (const uint16_t v : *out) FUZZ_CHECK(v == 0xBEEF, "out written on error (group)");
    const bool list_refused = one_thread.code() == ErrorCode::kSizeMismatch;
    FUZZ_CHECK(!list_refused || info.format_version >= 10, "the frame's own list refused");
    FUZZ_CHECK(list_refused || (one_thread.code() == ErrorCode::kChecksumMismatch) == stats_ok,
               "delta_stats and delta_decompress_tensors disagree on the payload");
  }
  FUZZ_CHECK((*out)[n] == 0xBEEF, "write past count (group)");
  const Status two_threads =
      delta_decompress_tensors(scattered.data(), scattered.size(), data, size, checksum, 2);
  FUZZ_CHECK(two_threads.code() == one_thread.code(), "group result depends on the layout");
  for (const auto& part : parts) {
    FUZZ_CHECK(part.back() == 0xBEEF, "write past a tensor (group)");
    if (!two_threads.ok()) {
      for (const uint16_t v : part) FUZZ_CHECK(v == 0xBEEF, "scattered out written on error");
    }
  }
  return 0;
}

int FuzzDecode(const uint8_t* data, size_t size) {
  PayloadInfo info;
  const Status inspected = delta_inspect(data, size, &info);
  PayloadStats blind;
  const Status blind_status = delta_stats(data, size, &blind);
  if (blind_status.ok()) FUZZ_CHECK(inspected.ok(), "stats ok but inspect failed");
  if (!inspected.ok()) {
    // Decoding must fail the same way whatever the base.
    const uint16_t one = 0x3F80;
    uint16_t out = 0x1234;
    const Status s = delta_decompress(&one, 1, data, size, 0, &out);
    FUZZ_CHECK(!s.ok(), "header rejected by inspect but accepted by decompress");
    FUZZ_CHECK(out == 0x1234, "out written on error");
    return 0;
  }
  const uint64_t n = info.element_count;
  if (n > kMaxElements) return 0;
  static const std::vector<uint16_t>* const kBase =
      new std::vector<uint16_t>(MakeBase(kMaxElements));
  const std::vector<uint16_t> src(kBase->begin(), kBase->begin() + static_cast<std::ptrdiff_t>(n));
  // The result must never be reported as correct: the checksum is of a tensor the payload
  // cannot produce unless it decodes to exactly this sentinel fill.
  const uint64_t checksum = 0x0123456789ABCDEFull;

  // src/codec/FORMAT.md Frame_Header: byte 5 holds the flags, bit 0 = Session (version 2).
  const bool session = info.format_version >= 2 && (data[5] & 1) != 0;
  PayloadStats stats;
  const Status stats_status = delta_stats(src.data(), n, data, size, &stats);
  if (stats_status.ok()) {
    // Session payloads' modelled and rANS chunks need the history: delta_stats only
    // measures them.
    FUZZ_CHECK(
        stats.counts_known ||
            (session && stats.chunk_modes[2] + stats.chunk_modes[3] + stats.chunk_modes[4] > 0),
        "counts unknown with a base");
    FUZZ_CHECK(stats.changed <= n, "more changes than elements");
    FUZZ_CHECK(stats.exponent_or_sign <= stats.changed, "more high changes than changes");
    FUZZ_CHECK(stats.chunk_modes[0] + stats.chunk_modes[1] + stats.chunk_modes[2] +
                       stats.chunk_modes[3] + stats.chunk_modes[4] ==
                   stats.info.chunk_count,
               "chunk modes do not add up");
    FUZZ_CHECK(stats.position_bytes + stats.mantissa_bytes + stats.high_bytes +
                       stats.modelled_bytes + stats.rans_bytes + stats.overhead_bytes ==
                   size,
               "byte kinds do not add up to the payload size");
  }

  std::vector<uint16_t> out(n + 1, 0xBEEF);
  if (session) return FuzzSessionDecode(src, info, data, size, checksum, &out);
  // src/codec/FORMAT.md Frame_Header: Flags bit 1 = several tensors (version 6).
  if (info.format_version >= 6 && (data[5] & 2) != 0) {
    return FuzzTensorsDecode(src, info, data, size, checksum, stats_status.ok(), &out);
  }
  const Status one_thread =
      delta_decompress(src.data(), n, data, size, checksum, out.data(), n, /*threads=*/1);
  FUZZ_CHECK(!one_thread.ok() || n == 0 || Checksum(out.data(), n) == checksum,
             "reported success with a result that does not match the checksum");
  if (!one_thread.ok()) {
    for (const uint16_t v : out) FUZZ_CHECK(v == 0xBEEF, "out written on error");
    // Every structural error is found before the checksum; delta_stats decodes the same.
    FUZZ_CHECK((one_thread.code() == ErrorCode::kChecksumMismatch) == stats_status.ok(),
               "delta_stats and delta_decompress disagree on the payload");
  }
  FUZZ_CHECK(out[n] == 0xBEEF, "write past count");

  std::vector<uint16_t> in_place = src;
  const Status two_threads =
      delta_decompress(in_place.data(), n, data, size, checksum, in_place.data(), n, /*threads=*/2);
  FUZZ_CHECK(two_threads.code() == one_thread.code(), "result depends on the thread count");
  if (!two_threads.ok()) FUZZ_CHECK(in_place == src, "in-place out written on error");

  // Too small an output must be refused before anything is written.
  if (n > 0) {
    std::vector<uint16_t> small(n, 0xBEEF);
    const Status s = delta_decompress(src.data(), n, data, size, checksum, small.data(), n - 1, 1);
    FUZZ_CHECK(!s.ok(), "accepted an output smaller than the payload");
    for (const uint16_t v : small) FUZZ_CHECK(v == 0xBEEF, "out written on error");
  }
  return 0;
}

}  // namespace fuzz
}  // namespace arc_v3

ARC_V3_FUZZ_ENTRY(arc_v3::fuzz::FuzzDecode)

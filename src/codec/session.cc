// arc_v3::Session: stateless frames plus the per-element history both sides keep
// (model_coder.h), and the identity of that history, which every session payload names.

#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/codec_internal.h"
#include "src/codec/model_coder.h"
#include "src/common/status_macros.h"
#include "src/common/xxh3.h"

namespace arc_v3 {

uint64_t NextHistoryId(uint64_t history_id, uint64_t base_checksum, uint64_t target_checksum) {
  const uint64_t fields[3] = {history_id, base_checksum, target_checksum};
  uint8_t bytes[24];
  for (int f = 0; f < 3; ++f) {
    for (int i = 0; i < 8; ++i) bytes[8 * f + i] = static_cast<uint8_t>(fields[f] >> (8 * i));
  }
  return XXH3_64bits(bytes, sizeof(bytes));
}

struct Session::State {
  Options options;
  std::vector<uint8_t> history;  // empty until the first step fixes the element count
  std::vector<uint8_t> next_history;
  uint64_t history_id = 0;
  uint64_t steps = 0;
  // Each chunk's carried model (model_coder.h; null: none yet), and a step's new ones.
  std::vector<ModelStatePtr> models;
  std::vector<ModelStatePtr> next_models;
  // The last step, which the next one may continue: its result's
  // checksum and, if its frame listed tensors, their element counts.
  uint64_t last_checksum = 0;
  bool last_listed_tensors = false;
  std::vector<uint64_t> last_tensors;

  Status Compress(const uint16_t* src, const uint16_t* dst, size_t count,
                  const std::vector<uint64_t>* tensors, Delta* out);
  // The history a step of `count` elements decodes with (a fresh one for the first step,
  // so that a failed step leaves the session untouched), or an error.
  Status HistoryFor(size_t count, std::vector<uint8_t>* fresh, const uint8_t** step_history);
  // After a successful step: the decoded history becomes the session's; `tensors`: the
  // frame's tensor list, or null for a one-tensor frame.
  void Advance(uint64_t base_checksum, uint64_t checksum, const std::vector<uint64_t>* tensors);
  // After a successful step, either side: what the next step may continue.
  void KeepLastStep(uint64_t checksum, const std::vector<uint64_t>* tensors) {
    last_checksum = checksum;
    last_listed_tensors = tensors != nullptr;
    if (tensors != nullptr) last_tensors = *tensors;
  }
  // After a successful step: chunks coded as modelled in it carry its models; the others
  // keep theirs.
  void KeepModels();
  // What this step's payload must name, and the models it codes from and into (the base
  // checksum is the caller's to fill in).
  SessionFrame StepFrame() {
    SessionFrame frame;
    frame.history_id = history_id;
    frame.models = &models;
    frame.next_models = &next_models;
    frame.has_last_step = steps > 0;
    frame.last_checksum = last_checksum;
    frame.last_tensors = last_listed_tensors ? &last_tensors : nullptr;
    return frame;
  }
};

Session::Session(const Options& options) : state_(new State) { state_->options = options; }
Session::~Session() { delete state_; }
Session::Session(Session&& other) noexcept : state_(other.state_) { other.state_ = nullptr; }
Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    delete state_;
    state_ = other.state_;
    other.state_ = nullptr;
  }
  return *this;
}

uint64_t Session::steps() const { return state_ != nullptr ? state_->steps : 0; }
uint64_t Session::history_id() const { return state_ != nullptr ? state_->history_id : 0; }

void Session::Reset() {
  if (state_ == nullptr) return;
  state_->history.clear();
  state_->history_id = 0;
  state_->steps = 0;
  state_->models.clear();
}

namespace {

// Makes `history` hold `count` elements: a fresh session starts from zeros; a session
// whose tensor changed size cannot go on.
Status PrepareHistory(size_t count, uint64_t steps, std::vector<uint8_t>* history) {
  if (steps == 0) {
    history->assign(count, 0);
    return Status::Ok();
  }
  if (history->size() != count) {
    return Status(ErrorCode::kSizeMismatch,
                  "the session's tensor had " + std::to_string(history->size()) +
                      " elements, now " + std::to_string(count) + " (Reset both sides)");
  }
  return Status::Ok();
}

}  // namespace

// One step of the sender, for one tensor (tensors == nullptr) or the concatenation of a
// group.
Status Session::State::Compress(const uint16_t* src, const uint16_t* dst, size_t count,
                                const std::vector<uint64_t>* tensors, Delta* out) {
  ARC_V3_RETURN_IF_ERROR(PrepareHistory(count, steps, &history));
  SessionFrame frame = StepFrame();
  frame.base_checksum = Checksum(src, count);
  ARC_V3_RETURN_IF_ERROR(
      EncodeFrame(src, dst, count, options, history.data(), &frame, out, nullptr, tensors));
  AdvanceHistory(src, dst, count, history.data());
  history_id = NextHistoryId(frame.history_id, frame.base_checksum, out->checksum);
  steps += 1;
  KeepModels();
  KeepLastStep(out->checksum, tensors);
  return Status::Ok();
}

void Session::State::KeepModels() {
  if (models.size() < next_models.size()) models.resize(next_models.size());
  for (size_t c = 0; c < next_models.size(); ++c) {
    if (next_models[c] != nullptr) models[c] = std::move(next_models[c]);
  }
  next_models.clear();
}

Status Session::Compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out) {
  if (state_ == nullptr) return Status(ErrorCode::kInvalidArgument, "moved-from session");
  if (count > 0 && (src == nullptr || dst == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "src or dst is null");
  }
  try {
    return state_->Compress(src, dst, count, nullptr, out);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory for the session history");
  }
}

Status Session::CompressTensors(const TensorDelta* tensors, size_t tensor_count, Delta* out) {
  if (state_ == nullptr) return Status(ErrorCode::kInvalidArgument, "moved-from session");
  try {
    ConcatenatedTensors group;
    ARC_V3_RETURN_IF_ERROR(ConcatenateTensors(tensors, tensor_count, &group));
    return state_->Compress(group.src, group.dst, group.total, &group.counts, out);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory for the session history");
  }
}

Status Session::State::HistoryFor(size_t count, std::vector<uint8_t>* fresh,
                                  const uint8_t** step_history) {
  if (steps == 0) {
    fresh->assign(count, 0);
    *step_history = fresh->data();
  } else if (history.size() != count) {
    return PrepareHistory(count, steps, &history);
  } else {
    *step_history = history.data();
  }
  next_history.resize(count);
  return Status::Ok();
}

void Session::State::Advance(uint64_t base_checksum, uint64_t checksum,
                             const std::vector<uint64_t>* tensors) {
  history.swap(next_history);
  history_id = NextHistoryId(history_id, base_checksum, checksum);
  steps += 1;
  KeepModels();
  KeepLastStep(checksum, tensors);
}

Status Session::Decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                           uint64_t checksum, uint16_t* out) {
  if (state_ == nullptr) return Status(ErrorCode::kInvalidArgument, "moved-from session");
  if (count > 0 && (src == nullptr || out == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "src or out is null");
  }
  try {
    std::vector<uint8_t> fresh;
    const uint8_t* history;
    ARC_V3_RETURN_IF_ERROR(state_->HistoryFor(count, &fresh, &history));
    SessionFrame expected = state_->StepFrame();
    expected.base_checksum = Checksum(src, count);
    ARC_V3_RETURN_IF_ERROR(DecodeFrame(src, count, bytes, size, checksum, out, count,
                                       state_->options.threads, history, &expected,
                                       state_->next_history.data()));
    state_->Advance(expected.base_checksum, checksum, nullptr);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory for the session history");
  }
}

Status Session::DecompressTensors(const TensorOut* tensors, size_t tensor_count,
                                  const uint8_t* bytes, size_t size, uint64_t checksum) {
  if (state_ == nullptr) return Status(ErrorCode::kInvalidArgument, "moved-from session");
  try {
    std::vector<uint64_t> counts;
    size_t total;
    ARC_V3_RETURN_IF_ERROR(ListTensors(tensors, tensor_count, &counts, &total));
    std::vector<uint8_t> fresh;
    const uint8_t* history;
    ARC_V3_RETURN_IF_ERROR(state_->HistoryFor(total, &fresh, &history));
    uint64_t base_checksum = 0;
    bool listed_tensors = false;
    SessionFrame session = state_->StepFrame();
    session.frame_listed_tensors = &listed_tensors;
    ARC_V3_RETURN_IF_ERROR(DecodeTensors(tensors, tensor_count, counts, total, bytes, size,
                                         checksum, state_->options.threads, history, &session,
                                         state_->next_history.data(), &base_checksum));
    state_->Advance(base_checksum, checksum, listed_tensors ? &counts : nullptr);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory for the session history");
  }
}

}  // namespace arc_v3

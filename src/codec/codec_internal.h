// The frame encoder and decoder behind the public calls, with the session parameters the
// stateless API does not expose. Shared by encoder.cc, decoder.cc and session.cc.
#ifndef ARC_V3_SRC_CODEC_CODEC_INTERNAL_H_
#define ARC_V3_SRC_CODEC_CODEC_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/model_coder.h"

namespace arc_v3 {

// What a session payload promises (src/codec/FORMAT.md "Sessions").
struct SessionFrame {
  uint64_t base_checksum = 0;  // XXH3-64 of src
  uint64_t history_id = 0;     // identity of the history the payload was coded with
  // The session's last successful step, which a frame with the Continues flag
  // refers to instead of naming its base and tensors: the checksum of its result and its
  // tensor list (null: a one-tensor frame). The encoder sets the flag when this step's
  // base is that result and its list that list; the decoder fills both fields in from them.
  bool has_last_step = false;
  uint64_t last_checksum = 0;
  const std::vector<uint64_t>* last_tensors = nullptr;
  // Decoder: receives whether the frame listed tensors (Tensors flag), once it decoded.
  bool* frame_listed_tensors = nullptr;

  // Whether a step from base_checksum over `tensors` (null: one tensor) continues the last
  // step.
  bool ContinuesLastStep(const std::vector<uint64_t>* tensors) const {
    if (!has_last_step || base_checksum != last_checksum) return false;
    if (tensors == nullptr || last_tensors == nullptr) return tensors == last_tensors;
    return *tensors == *last_tensors;
  }
  // The session's carried models (model_coder.h), by chunk: `models[c]` is the state chunk
  // c's last modelled step ended on (null: none yet, as are chunks past the vector's end).
  // `next_models`, if set, is resized to the frame's chunk count and receives this step's
  // states: null for chunks not coded as modelled.
  const std::vector<ModelStatePtr>* models = nullptr;
  std::vector<ModelStatePtr>* next_models = nullptr;

  // Empties next_models for a frame of `num_chunks` chunks (nothing without a session).
  static void PrepareNextModels(const SessionFrame* session, size_t num_chunks) {
    if (session == nullptr || session->next_models == nullptr) return;
    session->next_models->clear();
    session->next_models->resize(num_chunks);
  }
  // Chunk c's carried model and the slot its new one goes to.
  static CarriedModel CarriedFor(const SessionFrame* session, size_t c) {
    CarriedModel carried;
    if (session == nullptr) return carried;
    if (session->models != nullptr && c < session->models->size()) {
      carried.start = (*session->models)[c].get();
    }
    if (session->next_models != nullptr) carried.end = &(*session->next_models)[c];
    return carried;
  }
};

// `history`: one byte per element (model_coder.h), or nullptr when stateless, in which
// case `session` must be nullptr too. `base_checksum`, if not null, receives
// Checksum(src); on one thread both checksums are computed slice by slice as the chunks
// are first read. `tensors`: for a group of tensors, the element count of each (src and
// dst are their concatenations), named in the frame header (by its check); nullptr for
// one tensor.
Status EncodeFrame(const uint16_t* src, const uint16_t* dst, size_t count, const Options& options,
                   const uint8_t* history, const SessionFrame* session, Delta* out,
                   uint64_t* base_checksum = nullptr,
                   const std::vector<uint64_t>* tensors = nullptr);

// `expected` / `history` as above. With a session, `next_history` (count bytes) receives
// the history advanced by this step, written only if the call succeeds.
// `tensors`: for delta_decompress_tensors, the element count of each tensor the caller
// holds (src and out are their concatenations); a frame of several tensors must list the
// same counts, a one-tensor frame must match a list of one. nullptr: a one-tensor call,
// which refuses frames of several tensors.
Status DecodeFrame(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                   uint64_t checksum, uint16_t* out, size_t out_capacity, int threads,
                   const uint8_t* history, const SessionFrame* expected, uint8_t* next_history,
                   const std::vector<uint64_t>* tensors = nullptr);

// The element counts of the tensors of delta_compress_tensors / delta_decompress_tensors
// and their total, after checking that every tensor with elements has both its arrays
// (src and dst, or src and out) and that the total stays within 2^62.
inline const void* SecondArray(const TensorDelta& tensor) { return tensor.dst; }
inline const void* SecondArray(const TensorOut& tensor) { return tensor.out; }
template <class Tensor>
Status ListTensors(const Tensor* tensors, size_t tensor_count, std::vector<uint64_t>* counts,
                   size_t* total) {
  if (tensors == nullptr && tensor_count > 0) {
    return Status(ErrorCode::kInvalidArgument, "tensors is null");
  }
  counts->resize(tensor_count);
  *total = 0;
  for (size_t t = 0; t < tensor_count; ++t) {
    const Tensor& tensor = tensors[t];
    if (tensor.count > 0 && (tensor.src == nullptr || SecondArray(tensor) == nullptr)) {
      return Status(ErrorCode::kInvalidArgument, "tensor " + std::to_string(t) + ": null array");
    }
    if (tensor.count > (size_t{1} << 62) - *total) {
      return Status(ErrorCode::kInvalidArgument, "more than 2^62 elements in all");
    }
    (*counts)[t] = tensor.count;
    *total += tensor.count;
  }
  return Status::Ok();
}

// The first of the tensors' arrays that `field` picks (src, dst or out) if they lie back to
// back in memory (a safetensors file, a flat parameter buffer), else nullptr; for tensors
// without elements, a non-null dummy.
template <class Tensor, class Field>
auto BackToBack(const Tensor* tensors, size_t tensor_count, const Field& field)
    -> decltype(field(tensors[0])) {
  static uint16_t no_elements[1];
  decltype(field(tensors[0])) start = nullptr;
  decltype(field(tensors[0])) end = nullptr;
  for (size_t t = 0; t < tensor_count; ++t) {
    if (tensors[t].count == 0) continue;
    const auto values = field(tensors[t]);
    if (start == nullptr) start = values;
    if (end != nullptr && values != end) return nullptr;
    end = values + tensors[t].count;
  }
  return start != nullptr ? start : no_elements;
}

// The tensors' arrays that `field` picks, copied one after the other into `copy`.
template <class Tensor, class Field>
const uint16_t* Gather(const Tensor* tensors, size_t tensor_count, size_t total, const Field& field,
                       std::vector<uint16_t>* copy) {
  copy->resize(total);
  size_t at = 0;
  for (size_t t = 0; t < tensor_count; ++t) {
    if (tensors[t].count == 0) continue;
    std::memcpy(copy->data() + at, field(tensors[t]), tensors[t].count * sizeof(uint16_t));
    at += tensors[t].count;
  }
  return copy->data();
}

// The tensors of a group as their two concatenated arrays: the tensors' own memory when
// they lie back to back (a safetensors file, a flat parameter buffer), else copies.
struct ConcatenatedTensors {
  const uint16_t* src = nullptr;
  const uint16_t* dst = nullptr;
  size_t total = 0;
  std::vector<uint64_t> counts;
  std::vector<uint16_t> src_copy, dst_copy;
};
Status ConcatenateTensors(const TensorDelta* tensors, size_t tensor_count,
                          ConcatenatedTensors* group);  // may throw std::bad_alloc

// Decodes a payload onto a group of tensors (`counts` and `total` from ListTensors),
// writing every `out` or none. With `session` (its history id and models; its base
// checksum is not read), src's concatenation must have the payload's base checksum,
// returned in `base_checksum`, and `history` /
// `next_history` hold `total` bytes as for DecodeFrame. May throw std::bad_alloc.
Status DecodeTensors(const TensorOut* tensors, size_t tensor_count,
                     const std::vector<uint64_t>& counts, size_t total, const uint8_t* bytes,
                     size_t size, uint64_t checksum, int threads, const uint8_t* history,
                     const SessionFrame* session, uint8_t* next_history, uint64_t* base_checksum);

// Checksum() of values given in consecutive pieces (XXH3-64 streaming, seed 0).
class ChecksumStream {
 public:
  ChecksumStream();  // throws std::bad_alloc
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  void Update(const uint16_t* values, size_t count);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};

// The history identity after a step from a base to a target with these checksums.
uint64_t NextHistoryId(uint64_t history_id, uint64_t base_checksum, uint64_t target_checksum);

// Tensor_List_Check: the low 32 bits of XXH3-64 of the tensors'
// element counts, each as a u64 little-endian.
uint32_t TensorListCheck(const std::vector<uint64_t>& counts);

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_CODEC_INTERNAL_H_

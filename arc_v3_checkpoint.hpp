// arc_v3 checkpoint deltas: the delta of a whole state dict (named tensors of any dtype)
// as one checkpoint delta container (src/checkpoint/FORMAT.md), the bytes `arc_v3 diff`
// writes for the two saved as single safetensors files. BF16 tensors are coded with the
// codec of arc_v3.hpp; other dtypes, new tensors and changed shapes travel whole.
//
// Bazel: //:arc_v3_checkpoint. Thread-safe: calls share no state.
#ifndef ARC_V3_CHECKPOINT_HPP_
#define ARC_V3_CHECKPOINT_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {

// A tensor in caller memory; dtype is a safetensors dtype name ("BF16", "F32", "I64", ...).
struct NamedTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  const void* data = nullptr;  // C order, little endian; dtype size x product(shape) bytes
};

// Bytes per element of a safetensors dtype name; 0 for a name it does not know.
size_t DtypeSize(const std::string& dtype);

// The first bytes of every checkpoint delta container.
constexpr char kDeltaMagic[4] = {'A', '3', 'D', 'C'};

struct StateDictOptions {
  Format format = Format::kDefault;
  int effort = kDefaultEffort;  // codec effort 0..3 (Options::effort) for the BF16 tensors
  int threads = 0;  // 0: all cores; the bytes do not depend on it
};

// The delta of `next` against `prev` (tensors matched by name; each list names a tensor
// once). Errors: kInvalidArgument (an unknown dtype, a size that is not dtype x shape, a
// name twice), kOutOfMemory.
Status StateDictDiff(const std::vector<NamedTensor>& prev, const std::vector<NamedTensor>& next,
                     const StateDictOptions& options, std::vector<uint8_t>* delta);

// Memory for one rebuilt tensor: sets *data to a writable buffer of `bytes` bytes (dtype
// size x product(shape)) that stays valid until the apply returns (the caller keeps it
// after), or returns an error that stops the apply. Called on the calling thread, before
// any decoding.
using TensorAllocator =
    std::function<Status(const std::string& name, const std::string& dtype,
                         const std::vector<uint64_t>& shape, uint64_t bytes, void** data)>;

// Rebuilds the state dict a StateDictDiff delta leads to from `prev` (read only) into
// memory from `allocate`; `next` receives the rebuilt tensors in the delta's order (a
// tensor of no bytes gets no allocate call and a null data).
// Every piece is verified against the checksums the delta records, the target's safetensors
// header included. On error `next` is left empty and nothing allocated holds a valid
// tensor. Errors: the codec's decoding codes (kTruncated, kBadMagic, kChecksumMismatch,
// ...); kInvalidArgument for a delta of a sharded checkpoint directory;
// kChecksumMismatch where `prev` is not the state dict the delta was made from.
Status StateDictApply(const std::vector<NamedTensor>& prev, const uint8_t* delta, size_t size,
                      const TensorAllocator& allocate, int threads, std::vector<NamedTensor>* next);

// One tensor of a delta, as its manifest records it.
struct DeltaTensorInfo {
  std::string name;
  std::string kind;  // "delta" (coded against the base), "added" or "reshaped" (carried whole)
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<std::string> coders;  // per stored piece; a grouped tensor: its group's ("arc_v3")
  int64_t group = -1;               // the group whose payload codes it, or -1
};

// What a delta holds, from its checked manifest (no piece is decoded).
struct DeltaInfo {
  bool directory = false;  // the delta of a sharded checkpoint directory
  uint32_t container_version = 0;
  std::vector<DeltaTensorInfo> tensors;
  std::vector<std::string> removed_tensors;
};
Status InspectDelta(const uint8_t* delta, size_t size, DeltaInfo* info);

}  // namespace arc_v3

#endif  // ARC_V3_CHECKPOINT_HPP_

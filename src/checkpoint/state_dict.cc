// The state-dict API of arc_v3_checkpoint.hpp over the container and TensorApply.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3_checkpoint.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"
#include "src/checkpoint/inspect.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/tensor_apply.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace {

static_assert(sizeof(kDeltaMagic) == sizeof(checkpoint::kMagic) &&
                  kDeltaMagic[0] == checkpoint::kMagic[0] &&
                  kDeltaMagic[1] == checkpoint::kMagic[1] &&
                  kDeltaMagic[2] == checkpoint::kMagic[2] &&
                  kDeltaMagic[3] == checkpoint::kMagic[3],
              "arc_v3_checkpoint.hpp's kDeltaMagic is the container's");

// The names the state dicts' files take inside the container.
constexpr char kPrevName[] = "prev_state_dict";
constexpr char kNextName[] = "model.safetensors";

Status OpenDelta(const uint8_t* delta, size_t size, checkpoint::Reader* reader) {
  if (delta == nullptr && size != 0) return Status(ErrorCode::kInvalidArgument, "delta is null");
  std::vector<uint8_t> copy(delta, delta + size);  // the Reader owns its bytes
  return checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(std::move(copy)),
                                  reader);
}

// The target file's header and fill bytes: not tensors, but verified all the same.
Status VerifyFileBytes(const checkpoint::Reader& reader, const checkpoint::FileEntry& file) {
  for (const checkpoint::Piece* piece : {&file.header, &file.fill}) {
    if (piece == &file.fill && file.fills.empty()) continue;
    std::vector<uint8_t> scratch, out(piece->row_end);
    const uint8_t* stored = nullptr;
    ARC_V3_RETURN_IF_ERROR(reader.ReadPiece(*piece, &scratch, &stored));
    ARC_V3_RETURN_IF_ERROR(
        checkpoint::DecodePiece(*piece, stored, nullptr, piece->row_end, 1, out.data()));
  }
  return Status::Ok();
}

}  // namespace

size_t DtypeSize(const std::string& dtype) { return safetensors::DTypeSize(dtype); }

Status StateDictDiff(const std::vector<NamedTensor>& prev, const std::vector<NamedTensor>& next,
                     const StateDictOptions& options, std::vector<uint8_t>* delta) {
  checkpoint::Checkpoint base, target;
  ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::FromMemory(kPrevName, prev, &base));
  ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::FromMemory(kNextName, next, &target));
  checkpoint::RunOptions o;
  o.format = options.format;
  o.effort = options.effort;
  o.threads = options.threads;
  return checkpoint::Diff(base, target, o, delta, nullptr);
}

Status StateDictApply(const std::vector<NamedTensor>& prev, const uint8_t* delta, size_t size,
                      const TensorAllocator& allocate, int threads,
                      std::vector<NamedTensor>* next) {
  next->clear();
  checkpoint::Reader reader;
  ARC_V3_RETURN_IF_ERROR(OpenDelta(delta, size, &reader));
  const checkpoint::Manifest& m = reader.manifest();
  if (m.directory || m.files.size() != 1) {
    return Status(ErrorCode::kInvalidArgument,
                  "a delta of a sharded checkpoint directory, not of one state dict");
  }
  checkpoint::HeldTensors held;
  for (const NamedTensor& t : prev) {
    checkpoint::HeldTensor h;
    h.dtype = t.dtype;
    h.shape = t.shape;
    h.row_end = t.shape.empty() ? 1 : t.shape[0];
    // Read only: nothing is applied in place.
    h.data = static_cast<uint8_t*>(const_cast<void*>(t.data));
    held[t.name] = std::move(h);
  }
  const auto all = [](const checkpoint::TensorEntry& t) {
    return std::make_pair(uint64_t{0}, t.rows());
  };
  const auto fresh = [&](const checkpoint::TensorEntry& t, uint64_t, uint64_t,
                         checkpoint::HeldTensor* h) {
    void* data = nullptr;
    ARC_V3_RETURN_IF_ERROR(allocate(t.name, t.dtype, t.shape, t.bytes(), &data));
    if (data == nullptr && t.bytes() != 0) {
      return Status(ErrorCode::kInvalidArgument, "allocate('" + t.name + "') gave no memory");
    }
    h->data = static_cast<uint8_t*>(data);
    return Status::Ok();
  };
  checkpoint::TensorApply apply;
  apply.set_base_name(kPrevName);
  ARC_V3_RETURN_IF_ERROR(apply.Plan(&reader, 0, held, all, fresh, /*in_place=*/false));
  ARC_V3_RETURN_IF_ERROR(VerifyFileBytes(reader, m.files[0]));
  ARC_V3_RETURN_IF_ERROR(apply.Decode(threads));
  apply.Commit(&held);
  for (const checkpoint::TensorEntry& t : m.files[0].tensors) {
    const auto it = held.find(t.name);
    if (it == held.end() && t.bytes() != 0) {
      return Status(ErrorCode::kInternal, "'" + t.name + "' was not rebuilt");
    }
    next->push_back(
        NamedTensor{t.name, t.dtype, t.shape, it == held.end() ? nullptr : it->second.data});
  }
  return Status::Ok();
}

Status InspectDelta(const uint8_t* delta, size_t size, DeltaInfo* info) {
  *info = DeltaInfo();
  checkpoint::Reader reader;
  ARC_V3_RETURN_IF_ERROR(OpenDelta(delta, size, &reader));
  return checkpoint::Inspect(reader, false, nullptr, 0, info);
}

}  // namespace arc_v3

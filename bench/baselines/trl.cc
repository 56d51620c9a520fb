// Hugging Face TRL's sparse weight-update sync, two variants, as described publicly
// (the published ARCv3 comparison's "Hugging Face TRL" entry; TRL draft PRs for sparse
// trainer -> vLLM weight sync):
// - draft: the changed elements' flat indices as int32 and their new BF16 values, raw,
//   no compression;
// - gap-delta: the indices as gaps, uint16 (uint32 for a tensor with a larger gap), and
//   the new values, raw.
// The nnz count is our framing (4 bytes per tensor).
#include <cstring>

#include "bench/baselines/common.h"

namespace arc_v3 {
namespace bench {
namespace {

// Copies prev and writes the new values at `positions`.
bool Scatter(const TensorView& tensor, const std::vector<uint32_t>& positions, ByteReader* reader,
             uint16_t* out) {
  std::vector<uint16_t> values(positions.size());
  if (!reader->GetArray(values.data(), values.size()) || !reader->AtEnd()) return false;
  std::memcpy(out, tensor.prev, tensor.count * sizeof(uint16_t));
  for (size_t k = 0; k < positions.size(); ++k) out[positions[k]] = values[k];
  return true;
}

std::vector<uint16_t> NewValues(const TensorView& tensor, const std::vector<uint32_t>& positions) {
  std::vector<uint16_t> values(positions.size());
  for (size_t k = 0; k < positions.size(); ++k) values[k] = tensor.next[positions[k]];
  return values;
}

class TrlDraft : public Codec {
 public:
  std::string Name() const override { return "trl_draft"; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    payload->clear();
    const std::vector<uint32_t> positions = ChangedPositions(tensor);
    ByteWriter writer(payload);
    writer.Put<uint32_t>(static_cast<uint32_t>(positions.size()));
    for (uint32_t p : positions) writer.Put<int32_t>(static_cast<int32_t>(p));
    const std::vector<uint16_t> values = NewValues(tensor, positions);
    writer.PutArray(values.data(), values.size());
    return true;
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    ByteReader reader(payload, size);
    uint32_t nnz = 0;
    if (!reader.Get(&nnz) || nnz > tensor.count) return false;
    std::vector<uint32_t> positions(nnz);
    for (uint32_t& p : positions) {
      int32_t index = 0;
      if (!reader.Get(&index) || index < 0 || static_cast<size_t>(index) >= tensor.count)
        return false;
      p = static_cast<uint32_t>(index);
    }
    return Scatter(tensor, positions, &reader, out);
  }
};

class TrlGapDelta : public Codec {
 public:
  std::string Name() const override { return "trl_gap"; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    payload->clear();
    const std::vector<uint32_t> positions = ChangedPositions(tensor);
    ByteWriter writer(payload);
    writer.Put<uint32_t>(static_cast<uint32_t>(positions.size()));
    PutGaps(positions, &writer);
    const std::vector<uint16_t> values = NewValues(tensor, positions);
    writer.PutArray(values.data(), values.size());
    return true;
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    ByteReader reader(payload, size);
    uint32_t nnz = 0;
    std::vector<uint32_t> positions;
    if (!reader.Get(&nnz) || nnz > tensor.count ||
        !GetGaps(&reader, nnz, tensor.count, &positions)) {
      return false;
    }
    return Scatter(tensor, positions, &reader, out);
  }
};

}  // namespace

std::unique_ptr<Codec> MakeTrlDraft() { return std::make_unique<TrlDraft>(); }
std::unique_ptr<Codec> MakeTrlGapDelta() { return std::make_unique<TrlGapDelta>(); }

}  // namespace bench
}  // namespace arc_v3

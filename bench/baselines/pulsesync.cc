// PULSESync as implemented in grail's sparse_codec, format v3.1 (module docstring and
// encoder: "COO indices (2D) with per-row delta encoding", "zstd level 1", "(v3.1) Integer
// downscaling: uint8 for row deltas, uint16 for col deltas", int32 otherwise):
// - changed elements as 2-D COO (row = flat / cols, col = flat % cols; 1-D tensors are
//   n x 1), sorted by (row, col);
// - row deltas: row - previous changed element's row (the first from 0), uint8 if all fit,
//   else int32;
// - col deltas: the column itself at the start of a row, else the gap to the previous
//   column, uint16 if all fit, else int32;
// - the new BF16 values, raw;
// - the payload through zstd level 1.
// grail frames all tensors of a step in one JSON-headed blob compressed once; here each
// tensor is one blob with a 6-byte binary header, which if anything favours PULSESync.
#include <algorithm>
#include <cstring>
#include <limits>

#include "bench/baselines/common.h"

namespace arc_v3 {
namespace bench {
namespace {

template <class Narrow>
void PutIndices(const std::vector<uint32_t>& values, ByteWriter* writer) {
  uint32_t max_value = 0;
  for (uint32_t v : values) max_value = std::max(max_value, v);
  const bool narrow = max_value <= std::numeric_limits<Narrow>::max();
  writer->Put<uint8_t>(narrow ? sizeof(Narrow) : 4);
  for (uint32_t v : values) {
    if (narrow) {
      writer->Put<Narrow>(static_cast<Narrow>(v));
    } else {
      writer->Put<int32_t>(static_cast<int32_t>(v));
    }
  }
}

template <class Narrow>
bool GetIndices(ByteReader* reader, size_t count, std::vector<uint32_t>* values) {
  uint8_t width = 0;
  if (!reader->Get(&width) || (width != sizeof(Narrow) && width != 4)) return false;
  values->resize(count);
  for (uint32_t& v : *values) {
    if (width == sizeof(Narrow)) {
      Narrow narrow = 0;
      if (!reader->Get(&narrow)) return false;
      v = narrow;
    } else {
      int32_t wide = 0;
      if (!reader->Get(&wide) || wide < 0) return false;
      v = static_cast<uint32_t>(wide);
    }
  }
  return true;
}

class PulseSync : public Codec {
 public:
  std::string Name() const override { return "pulsesync"; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    const std::vector<uint32_t> positions = ChangedPositions(tensor);  // already (row, col) order
    std::vector<uint32_t> row_deltas, col_deltas;
    std::vector<uint16_t> values;
    uint64_t last_row = 0, last_col = 0;
    for (size_t k = 0; k < positions.size(); ++k) {
      const uint64_t row = positions[k] / tensor.cols, col = positions[k] % tensor.cols;
      const bool new_row = k == 0 || row != last_row;
      row_deltas.push_back(static_cast<uint32_t>(row - last_row));
      col_deltas.push_back(static_cast<uint32_t>(new_row ? col : col - last_col));
      values.push_back(tensor.next[positions[k]]);
      last_row = row;
      last_col = col;
    }
    std::vector<uint8_t> raw;
    ByteWriter writer(&raw);
    writer.Put<uint32_t>(static_cast<uint32_t>(positions.size()));
    PutIndices<uint8_t>(row_deltas, &writer);
    PutIndices<uint16_t>(col_deltas, &writer);
    writer.PutArray(values.data(), values.size());
    return ZstdCompress(raw.data(), raw.size(), 1, payload);
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    std::vector<uint8_t> raw;
    if (!ZstdDecompress(payload, size, &raw)) return false;
    ByteReader reader(raw.data(), raw.size());
    uint32_t nnz = 0;
    std::vector<uint32_t> row_deltas, col_deltas;
    if (!reader.Get(&nnz) || nnz > tensor.count ||
        !GetIndices<uint8_t>(&reader, nnz, &row_deltas) ||
        !GetIndices<uint16_t>(&reader, nnz, &col_deltas)) {
      return false;
    }
    std::vector<uint16_t> values(nnz);
    if (!reader.GetArray(values.data(), nnz) || !reader.AtEnd()) return false;
    std::memcpy(out, tensor.prev, tensor.count * sizeof(uint16_t));
    uint64_t row = 0, col = 0;
    for (size_t k = 0; k < nnz; ++k) {
      row += row_deltas[k];
      col = (k == 0 || row_deltas[k] != 0) ? col_deltas[k] : col + col_deltas[k];
      if (row >= tensor.rows || col >= tensor.cols) return false;
      out[row * tensor.cols + col] = values[k];
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<Codec> MakePulseSync() { return std::make_unique<PulseSync>(); }

}  // namespace bench
}  // namespace arc_v3

// Competitors that compress the XOR of the whole tensor (or of its changes):
// - ARCv2-like: the ARCv3 announcement describes ARCv2 as XOR-based; public details stop
//   there, so this is the XOR of the whole tensor through zstd at its default level (3).
// - slime's deltas_zstd (THUDM/slime weight-update deltas): changed positions as uint16
//   gaps (uint32 for a tensor with a larger gap) and the changes as XOR values, the
//   buffer through zstd level 1.
// - plain zstd -19 and lz4 (LZ4_compress_default) of the XOR, as in the corpus README.
#include <lz4.h>

#include <cstring>
#include <string>

#include "bench/baselines/common.h"

namespace arc_v3 {
namespace bench {
namespace {

// out = prev ^ xors.
bool ApplyXorBytes(const TensorView& tensor, const std::vector<uint8_t>& xors, uint16_t* out) {
  if (xors.size() != tensor.count * sizeof(uint16_t)) return false;
  for (size_t i = 0; i < tensor.count; ++i) {
    uint16_t x;
    std::memcpy(&x, xors.data() + 2 * i, sizeof(x));
    out[i] = tensor.prev[i] ^ x;
  }
  return true;
}

class ZstdXor : public Codec {
 public:
  ZstdXor(std::string name, int level) : name_(std::move(name)), level_(level) {}
  std::string Name() const override { return name_; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    const std::vector<uint16_t> x = XorOf(tensor);
    return ZstdCompress(x.data(), x.size() * sizeof(uint16_t), level_, payload);
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    std::vector<uint8_t> raw;
    return ZstdDecompress(payload, size, &raw) && ApplyXorBytes(tensor, raw, out);
  }

 private:
  std::string name_;
  int level_;
};

class Lz4Xor : public Codec {
 public:
  std::string Name() const override { return "lz4_xor"; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    const std::vector<uint16_t> x = XorOf(tensor);
    const int size = static_cast<int>(x.size() * sizeof(uint16_t));
    payload->resize(LZ4_compressBound(size));
    const int written = LZ4_compress_default(reinterpret_cast<const char*>(x.data()),
                                             reinterpret_cast<char*>(payload->data()), size,
                                             static_cast<int>(payload->size()));
    payload->resize(written > 0 ? written : 0);
    return written > 0;
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    std::vector<uint8_t> raw(tensor.count * sizeof(uint16_t));
    const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(payload),
                                        reinterpret_cast<char*>(raw.data()), static_cast<int>(size),
                                        static_cast<int>(raw.size()));
    return got == static_cast<int>(raw.size()) && ApplyXorBytes(tensor, raw, out);
  }
};

class SlimeDeltasZstd : public Codec {
 public:
  std::string Name() const override { return "slime_zstd"; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    const std::vector<uint32_t> positions = ChangedPositions(tensor);
    std::vector<uint8_t> raw;
    ByteWriter writer(&raw);
    writer.Put<uint32_t>(static_cast<uint32_t>(positions.size()));
    PutGaps(positions, &writer);
    for (uint32_t p : positions) writer.Put<uint16_t>(tensor.prev[p] ^ tensor.next[p]);
    return ZstdCompress(raw.data(), raw.size(), 1, payload);
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    std::vector<uint8_t> raw;
    if (!ZstdDecompress(payload, size, &raw)) return false;
    ByteReader reader(raw.data(), raw.size());
    uint32_t nnz = 0;
    std::vector<uint32_t> positions;
    if (!reader.Get(&nnz) || nnz > tensor.count ||
        !GetGaps(&reader, nnz, tensor.count, &positions)) {
      return false;
    }
    std::vector<uint16_t> xors(nnz);
    if (!reader.GetArray(xors.data(), nnz) || !reader.AtEnd()) return false;
    std::memcpy(out, tensor.prev, tensor.count * sizeof(uint16_t));
    for (size_t k = 0; k < nnz; ++k) out[positions[k]] ^= xors[k];
    return true;
  }
};

}  // namespace

std::unique_ptr<Codec> MakeArcV2Like() { return std::make_unique<ZstdXor>("arcv2_like", 3); }
std::unique_ptr<Codec> MakeSlimeDeltasZstd() { return std::make_unique<SlimeDeltasZstd>(); }
std::unique_ptr<Codec> MakeZstdXor(int level) {
  return std::make_unique<ZstdXor>("zstd" + std::to_string(level) + "_xor", level);
}
std::unique_ptr<Codec> MakeLz4Xor() { return std::make_unique<Lz4Xor>(); }

}  // namespace bench
}  // namespace arc_v3

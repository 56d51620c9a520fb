// Helpers shared by the re-implemented competitors: little-endian byte streams with
// bounds checks, the changed elements of a tensor, and whole-buffer zstd / lz4.
#ifndef ARC_V3_BENCH_BASELINES_COMMON_H_
#define ARC_V3_BENCH_BASELINES_COMMON_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/codec.h"

namespace arc_v3 {
namespace bench {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  template <class T>
  void Put(T value) {  // host order is little endian on every target we build for
    const size_t at = out_->size();
    out_->resize(at + sizeof(T));
    std::memcpy(out_->data() + at, &value, sizeof(T));
  }
  template <class T>
  void PutArray(const T* values, size_t count) {
    const size_t at = out_->size();
    out_->resize(at + count * sizeof(T));
    if (count) std::memcpy(out_->data() + at, values, count * sizeof(T));
  }

 private:
  std::vector<uint8_t>* out_;
};

// Reads fail (return false) instead of reading past the end.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <class T>
  bool Get(T* value) {
    return GetArray(value, 1);
  }
  template <class T>
  bool GetArray(T* values, size_t count) {
    if (count > (size_ - pos_) / sizeof(T)) return false;
    if (count) std::memcpy(values, data_ + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
    return true;
  }
  bool AtEnd() const { return pos_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

// Indices (ascending) of the elements that differ between prev and next.
std::vector<uint32_t> ChangedPositions(const TensorView& tensor);

// Gaps between consecutive positions (the first is the position itself), as the trainer
// sends them: uint16 when every gap fits, else uint32. Writes the width byte first.
void PutGaps(const std::vector<uint32_t>& positions, ByteWriter* writer);
// Inverse of PutGaps for `count` positions, each checked to be < limit.
bool GetGaps(ByteReader* reader, size_t count, size_t limit, std::vector<uint32_t>* positions);

// prev ^ next of the whole tensor.
std::vector<uint16_t> XorOf(const TensorView& tensor);

// Whole-buffer zstd at `level` (the frame records the content size) and its inverse.
bool ZstdCompress(const void* data, size_t size, int level, std::vector<uint8_t>* out);
bool ZstdDecompress(const uint8_t* data, size_t size, std::vector<uint8_t>* out);

// The competitors (each file in bench/baselines/ cites its source).
std::unique_ptr<Codec> MakeTrlDraft();
std::unique_ptr<Codec> MakeTrlGapDelta();
std::unique_ptr<Codec> MakePulseSync();
std::unique_ptr<Codec> MakeArcV2Like();
std::unique_ptr<Codec> MakeSlimeDeltasZstd();
std::unique_ptr<Codec> MakeZstdXor(int level);
std::unique_ptr<Codec> MakeLz4Xor();

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_BASELINES_COMMON_H_

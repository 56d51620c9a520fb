// Constants and byte-level helpers of the payload format (src/codec/FORMAT.md). Shared by the
// encoder and the decoder; neither depends on the other.
#ifndef ARC_V3_SRC_CODEC_FORMAT_H_
#define ARC_V3_SRC_CODEC_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace arc_v3 {

constexpr uint8_t kMagic[4] = {'A', 'R', 'C', '3'};
// The Version byte. kFormatVersion (0x10, "1.0") is the one format the library writes by
// default and will read from 1.0 on; kFormatVersionArcV3 is ARCv3 as published
// (Format::kPublished). The values between them belonged to unreleased pre-1.0 formats and are
// rejected, so that no such payload is ever read as this one.
constexpr uint8_t kFormatVersionArcV3 = 1;
constexpr uint8_t kFormatVersion = 0x10;
constexpr uint8_t kMinChunkLog = 10;
constexpr uint8_t kMaxChunkLog = 24;
// Varints in this format never exceed 64 bits (10 bytes of LEB128).
constexpr int kMaxVarintBytes = 10;

// The first byte of every chunk (not in version 1, whose chunks are all XOR streams).
enum ChunkMode : uint8_t {
  kChunkUnchanged = 0,    // no element changed; the chunk is this byte
  kChunkXorStreams = 1,   // the XOR-stream body follows (Changed_Count > 0)
  kChunkModelled = 2,     // the context-modelled coding follows (model_coder.h)
  kChunkRans = 3,         // the rANS coding follows (rans_coder.h)
  kChunkRansHistory = 4,  // session payloads only: rANS with the history
};

// Frame_Header Flags (0 in version 1): bit 0 = session payload (Base_Checksum and
// History_Id follow Chunk_Log); bit 1 = several tensors (Tensor_Count and
// Tensor_List_Check follow Chunk_Log and the session fields); bit 2 (session frames only)
// = continues the session's last step (Base_Checksum and the tensor list are left out:
// they are that step's result checksum and tensors); bits 3-7 reserved.
constexpr uint8_t kFlagSession = 0x01;
constexpr uint8_t kFlagTensors = 0x02;
constexpr uint8_t kFlagContinues = 0x04;

// Chunk layout byte: bits 0-1 select how positions are coded; bits 2-7 are reserved.
enum PositionMode : uint8_t {
  kPositionsBitmap = 0,  // one bit per element of the chunk, LSB first
  kPositionsGaps = 1,    // varint (position - previous position - 1) per change
};
constexpr uint8_t kPositionModeMask = 0x03;

// Stream codec ids; the race keeps the smallest, ties go to the lower id (faster decoder).
enum StreamCodec : uint8_t {
  kCodecStored = 0,
  kCodecLz4 = 1,   // one LZ4 block (lz4 or lz4hc encoder)
  kCodecZstd = 2,  // one magicless zstd frame, no checksum, no content size
};
constexpr int kNumStreamCodecs = 3;

inline void PutVarint(uint64_t value, std::vector<uint8_t>* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<uint8_t>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<uint8_t>(value));
}

inline void PutU64(uint64_t value, std::vector<uint8_t>* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(value >> (8 * i)));
}

inline void PutU32(uint32_t value, std::vector<uint8_t>* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(value >> (8 * i)));
}

inline uint32_t LoadU32(const uint8_t* bytes) {
  return static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
         static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24;
}

inline uint64_t LoadU64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// Bounds-checked reader over untrusted bytes: every read reports failure instead of
// reading past the end. Varints must be minimal (no redundant 0x80 continuation bytes)
// so that each value has exactly one encoding.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  size_t position() const { return pos_; }
  const uint8_t* current() const { return data_ + pos_; }

  bool ReadByte(uint8_t* value) {
    if (pos_ >= size_) return false;
    *value = data_[pos_++];
    return true;
  }

  // false on truncation, overlong or non-minimal encodings; `ran_out` (optional) tells
  // which: set where the bytes ended before the varint did (FORMAT.md, "Errors").
  bool ReadVarint(uint64_t* value, bool* ran_out = nullptr) {
    uint64_t result = 0;
    if (ran_out != nullptr) *ran_out = false;
    for (int i = 0; i < kMaxVarintBytes; ++i) {
      if (pos_ >= size_) {
        if (ran_out != nullptr) *ran_out = true;
        return false;
      }
      const uint8_t byte = data_[pos_++];
      const uint64_t payload = byte & 0x7F;
      if (i == kMaxVarintBytes - 1 && payload > 1) return false;  // beyond 64 bits
      result |= payload << (7 * i);
      if ((byte & 0x80) == 0) {
        if (byte == 0 && i > 0) return false;  // non-minimal
        *value = result;
        return true;
      }
    }
    return false;
  }

  // Points *bytes at the next `size` bytes and skips them.
  bool ReadSpan(size_t size, const uint8_t** bytes) {
    if (size > remaining()) return false;
    *bytes = data_ + pos_;
    pos_ += size;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_FORMAT_H_

// Constants and byte-level helpers of the payload format (src/FORMAT.md). Shared by the
// encoder and the decoder; neither depends on the other.
#ifndef ARC_V3_SRC_FORMAT_H_
#define ARC_V3_SRC_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace arc_v3 {

constexpr uint8_t kMagic[4] = {'A', 'R', 'C', '3'};
// Version 1: ARCv3 as published (Format::kArcV3 still writes it). Version 2 adds a mode
// byte to every chunk and the context-modelled chunk coder. Version 3 (Format::kDefault)
// leaves the last chunk's size out of the chunk table (the chunk runs to the end of the
// payload) and lets modelled chunks use value priors (model_coder.h, kModelValuePriors).
// Version 4 adds rANS chunks (rans_coder.h). Version 5 (Format::kDefault) gives their value
// curves slopes and carries the start of their escape stream in the element states.
// Version 6 adds frames of several tensors (kFlagTensors); it changes nothing else, so
// the encoder writes it only for those and one-tensor payloads stay readable by decoders
// of version 5.
// Version 7 adds rANS chunks coded with a session's history (kChunkRansHistory); the
// encoder writes it only for session payloads that hold one.
// Version 8 adds modelled chunks that start from the model the same chunk of the session
// ended on in its last modelled step (model_coder.h, kModelCarried); likewise written only
// for session payloads that hold one.
// Version 9 adds session frames that continue the session's last step (kFlagContinues):
// their base is that step's result and their tensors are its tensors, so the frame leaves
// out Base_Checksum and the tensor list; written for every session step that qualifies.
// Version 10 replaces the tensor list of a frame of several tensors by Tensor_Count and a
// 32-bit check of the element counts (TensorListCheck): the decoder is handed the list
// anyway, and on a group of small tensors the counts were ~2% of the payload; written for
// every frame of several tensors that names its list. It also adds modelled chunks whose
// signs take their column's earlier signs as context (model_coder.h, kModelColumnSigns),
// written for every payload that holds one.
// Version 11 adds modelled chunks whose rates are capped (model_coder.h, kModelRateCap)
// and gives the split priors of every modelled chunk more weight (model_coder.cc,
// kTrustedSplitSeen); written for every payload that holds a modelled chunk.
// Version 12 codes the recent elements of a modelled chunk with history first
// (model_coder.h, IsRecent in kernels.h) and shrinks its History_Boosts to one byte;
// written for every payload that holds such a chunk.
constexpr uint8_t kFormatVersionArcV3 = 1;
constexpr uint8_t kFormatVersion = 12;
constexpr uint8_t kFormatVersionOneTensor = 5;
constexpr uint8_t kFirstModelledVersion = 2;
constexpr uint8_t kFirstTensorsVersion = 6;
constexpr uint8_t kFirstRansHistoryVersion = 7;
constexpr uint8_t kFirstCarriedModelVersion = 8;
constexpr uint8_t kFirstContinuesVersion = 9;
constexpr uint8_t kFirstListCheckVersion = 10;
constexpr uint8_t kFirstColumnSignsVersion = 10;
constexpr uint8_t kFirstRateCapVersion = 11;
constexpr uint8_t kFirstTrustedSplitsVersion = 11;
constexpr uint8_t kFirstRecentVersion = 12;
constexpr uint8_t kMinChunkLog = 10;
constexpr uint8_t kMaxChunkLog = 24;
// Varints in this format never exceed 64 bits (10 bytes of LEB128).
constexpr int kMaxVarintBytes = 10;

// Versions 2 to 4: the first byte of every chunk.
enum ChunkMode : uint8_t {
  kChunkUnchanged = 0,  // no element changed; the chunk is this byte
  kChunkXorStreams = 1,  // the version-1 chunk body follows (Changed_Count > 0)
  kChunkModelled = 2,    // the context-modelled coding follows (model_coder.h)
  kChunkRans = 3,        // version 4 on: the rANS coding follows (rans_coder.h)
  kChunkRansHistory = 4,  // version 7 on, in session payloads: rANS with the history
};

// Frame_Header Flags (version 2 on): bit 0 = session payload (Base_Checksum and
// History_Id follow Chunk_Log); bit 1 (version 6 on) = several tensors (Tensor_Count and
// the tensors' element counts, from version 10 Tensor_Count and Tensor_List_Check, follow
// Chunk_Log and the session fields); bit 2 (version 9
// on, session frames only) = continues the session's last step (Base_Checksum and the
// tensor list are left out: they are that step's result checksum and tensors); bits 3-7
// reserved.
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

  // false on truncation, overlong or non-minimal encodings.
  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int i = 0; i < kMaxVarintBytes; ++i) {
      if (pos_ >= size_) return false;
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

#endif  // ARC_V3_SRC_FORMAT_H_

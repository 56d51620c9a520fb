// rANS chunk coder: the same knowledge as the modelled coder
// (model_coder.h) — an element's chance to change halves with each step up of its
// exponent, and most changes are +-1 in monotone key order — but with probabilities
// fitted once per chunk and sent in its header, so that nothing adapts and both sides
// run 16 interleaved rANS states on vectors (the DecodeRansChanges and EncodeRansElements
// kernels): one symbol per element (unchanged, +1, -1, escape); only escapes (|d| >= 2,
// a minority of changes) go through a scalar stream.
//
// Where it pays: dense chunks, where the adaptive coder's serial binary decisions (a dozen
// or more per change) are slow to decode; this one costs about 90 header bytes
// (probabilities and coder states, a third of them carrying escape data) and codes about as
// small as the modelled coder there. The frame encoder picks it for dense chunks
// (encoder.cc, PreferRans).
//
// Layer: chunk coder, below the frame format, like model_coder.h. Integer arithmetic
// only: the bytes do not depend on the compiler, target or machine.
#ifndef ARC_V3_SRC_CODEC_RANS_CODER_H_
#define ARC_V3_SRC_CODEC_RANS_CODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/format.h"

namespace arc_v3 {

// The encoder's default (efforts 1-2) codes a chunk as rANS from this many changes and a
// density of 1 / kRansMinDensityInverse on, in a session 1 / ...WithHistory (encoder.cc,
// PreferRans).
constexpr uint64_t kRansMinChanges = 2048;
constexpr uint64_t kRansMinDensityInverse = 128;
constexpr uint64_t kRansMinDensityInverseWithHistory = 64;

// Largest chunk the rANS coder accepts, in elements (positions are u32).
constexpr size_t kMaxRansChunk = size_t{1} << 24;

// Room for the element stream's words, reused across chunks. Not zero-filled: the
// contents do not matter, and clearing them would cost a pass over 2 bytes per element.
class RansScratch {
 public:
  uint16_t* Reserve(size_t count) {
    if (count > capacity_) {
      words_.reset(new uint16_t[count]);
      capacity_ = count;
    }
    return words_.get();
  }

 private:
  std::unique_ptr<uint16_t[]> words_;
  size_t capacity_ = 0;
};

// Appends the rANS coding of one chunk (len <= kMaxRansChunk elements, with `changes` >
// 0 changed elements listed ascending in `positions`) to out. Deterministic. `scratch`,
// if given, is reused for the element stream's words across calls (its contents do not
// matter; it grows to len + 16 entries).
// `history`: a session's history of the chunk's elements (model_coder.h), or nullptr.
// With one, each exponent class is split by the element's last recorded change (none,
// up, down: RansHistoryClass, kernels.h), each with its own change probability and, for
// up and down, its own share of +1 against -1 steps: 64 more header bytes, spent only
// where the estimated saving exceeds them. `coded_with_history` (if not null) says
// whether the chunk uses the history (the frame's Chunk_Mode 4) or not (Chunk_Mode 3).
// @return ok, or kInvalidArgument (null pointer, len too large, no changes).
Status EncodeChunkRans(const uint16_t* src, const uint16_t* dst, size_t len,
                       const uint32_t* positions, size_t changes, std::vector<uint8_t>* out,
                       RansScratch* scratch = nullptr, const uint8_t* history = nullptr,
                       bool* coded_with_history = nullptr);

// Decodes a chunk written by EncodeChunkRans for the same `src` and `len`: replaces the
// contents of `positions` (ascending, < len) and `xors` (src[pos] ^ dst[pos], never 0).
// The input is untrusted: any bytes give a result or kCorruptChunk / kTruncated, never
// a read outside [bytes, bytes + size) nor a write outside the vectors. All `size` bytes
// must belong to the chunk. A wrong src gives a wrong result or kCorruptChunk; the
// frame's checksum catches the former.
// `history` not null: the chunk was coded with that history (Chunk_Mode 4).
// @return ok, kInvalidArgument (null pointers, len too large), kTruncated, kCorruptChunk.
Status DecodeChunkRans(const uint16_t* src, size_t len, const uint8_t* bytes, size_t size,
                       std::vector<uint32_t>* positions, std::vector<uint16_t>* xors,
                       const uint8_t* history = nullptr);

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_RANS_CODER_H_

// Context-modelled coding of one chunk of a BF16 delta (issue 4): the change positions and
// the changed values are coded with an adaptive binary range coder whose probabilities
// come from what the decoder already holds, the previous weights `src`.
//
// Layer: chunk coder, below the frame format. It knows nothing of frames, checksums or
// threads; the frame code (encoder.cc / decoder.cc) decides when to use it and stores
// the chunk's byte size. Self-contained: no zstd, lz4 or Highway.
//
// The model, in short (details in model_coder.cc):
// - A weight's chance to change halves with each step up of its exponent (the update
//   size does not depend on |w|, the BF16 ULP does). Each element gets the rate
//   r = 2^(kRateTop - exponent); a block of B elements gets S = sum r.
// - Positions: one "block has a change" decision per block, its context the quantised
//   log2 S and whether the previous blocks changed (rows vary in rate); inside a non-empty
//   block one decision per element until the first change, context the share of the
//   remaining rate that this element holds (r_i / sum_{j>=i} r_j), then one per element
//   with the element's exponent as context.
// - Values: d = key(next) - key(prev) in the monotone integer order of BF16 bit patterns
//   (a carry into the exponent or a step across zero is still +-1), coded as
//   log2 class (unary, exponent-conditioned), the bits below the top bit, and the sign.
// - Probabilities start from priors derived from the chunk's overall rate, sent in one
//   header byte, and adapt. Integer arithmetic only: the bytes do not depend on the
//   compiler, target or machine.
#ifndef ARC_V3_SRC_MODEL_CODER_H_
#define ARC_V3_SRC_MODEL_CODER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {

// Largest chunk the modelled coder accepts, in elements.
constexpr size_t kMaxModelledChunk = size_t{1} << 24;

// Monotone integer key of a BF16 bit pattern: a bijection on uint16 such that the key
// order is the value order (-NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN); -0 and +0
// are neighbours, so stepping across zero is +-1.
inline uint16_t MonotoneKey(uint16_t bits) {
  return (bits & 0x8000) ? static_cast<uint16_t>(0x7FFF - (bits & 0x7FFF))
                         : static_cast<uint16_t>(bits | 0x8000);
}
inline uint16_t FromMonotoneKey(uint16_t key) {
  return (key & 0x8000) ? static_cast<uint16_t>(key & 0x7FFF)
                        : static_cast<uint16_t>(0x8000 | (0x7FFF - key));
}

// Appends the modelled coding of one chunk (len <= kMaxModelledChunk elements) to out.
// Only positions where src and dst differ are coded. The bytes are deterministic.
// @return ok, or kInvalidArgument (null pointer with len > 0, len too large).
Status EncodeChunkModelled(const uint16_t* src, const uint16_t* dst, size_t len,
                           std::vector<uint8_t>* out);

// As above with a forced block size 2^log2_block, log2_block in [kMinModelBlockLog,
// kMaxModelBlockLog] (for measurements; EncodeChunkModelled picks it from the density).
constexpr int kMinModelBlockLog = 2;
constexpr int kMaxModelBlockLog = 8;
Status EncodeChunkModelledWithBlock(const uint16_t* src, const uint16_t* dst, size_t len,
                                    int log2_block, std::vector<uint8_t>* out);

// Decodes a chunk written by EncodeChunkModelled for the same `src` and `len`: replaces
// the contents of `positions` (ascending, < len) and `xors` (src[pos] ^ dst[pos], never 0).
// The input is untrusted: any bytes give either a result or kCorruptChunk / kTruncated,
// never a read outside [bytes, bytes + size) nor a write outside the vectors. All `size`
// bytes must belong to the chunk (trailing bytes are an error).
// @return ok, kInvalidArgument (null pointers, len too large), kTruncated, kCorruptChunk.
Status DecodeChunkModelled(const uint16_t* src, size_t len, const uint8_t* bytes, size_t size,
                           std::vector<uint32_t>* positions, std::vector<uint16_t>* xors);

}  // namespace arc_v3

#endif  // ARC_V3_SRC_MODEL_CODER_H_

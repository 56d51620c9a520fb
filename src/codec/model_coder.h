// Context-modelled coding of one chunk of a BF16 delta: the change positions and
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
// - Positions: one "block has a change" decision per block of B elements (B from the
//   density, 4..64), its context the quantised log2 S (contexts on whether neighbouring
//   blocks changed cost more than they gained on the corpus: the adaptive probabilities
//   already follow the rate of a region); inside a non-empty block, a rate-weighted
//   bisection: "does the left half hold a change?" (context: the left half's share of
//   the node's rate and the node's expected count) and, if so, "does the right half
//   too?" (context: the right half's expected count). About 2 log2(B) decisions per
//   change.
// - Values: d = key(next) - key(prev) in the monotone integer order of BF16 bit patterns
//   (a carry into the exponent or a step across zero is still +-1), coded as
//   log2 class (unary, exponent-conditioned), the bits below the top bit, and the sign.
// - Probabilities start from priors derived from the chunk's overall rate, sent in one
//   header byte, and adapt; the value contexts too: an element
//   expected to change more than once per step (rate far above the chunk's) moves by more
//   than one ULP, and the sign is a fair coin unless a session knows the last direction.
// - Column signs: in a weight matrix the updates of one column share
//   their sign more often than chance; given a sign period (the row length, which the
//   encoder picks among SignPeriodCandidates), each column counts its signs so far and the
//   count is the context of its next sign.
// - Recent elements (with a session history): an element whose last
//   change was 1 or 2 steps ago is coded first, one "changed again" decision in the
//   context of its age and rate log, and the bisection skips it (rate 1): its chance to
//   change again does not follow its exponent.
// - Integer arithmetic only: the bytes do not depend on the compiler, target or machine.
#ifndef ARC_V3_SRC_CODEC_MODEL_CODER_H_
#define ARC_V3_SRC_CODEC_MODEL_CODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/format.h"
#include "src/codec/kernels.h"

namespace arc_v3 {

// Chunk byte 0, bit 3: coded with a session history (EncodeChunkModelled's `history`); its
// recent elements are coded first (model_coder.cc, CodeRecent).
constexpr uint8_t kModelHistory = 0x08;

// Chunk byte 0, bit 4: the value contexts start from priors derived from the chunk's rate
// prior. The encoder always sets it; the decoder reads chunks with and without it.
constexpr uint8_t kModelValuePriors = 0x10;

// Chunk byte 0, bit 5: the chunk's contexts start from the probabilities the same chunk
// of the session's last modelled step ended on, not from priors.
constexpr uint8_t kModelCarried = 0x20;

// Chunk byte 0, bit 6: signs are coded with their column's earlier signs as context, for a
// sign period (the row length) in the header (model_coder.cc, ColumnSigns).
constexpr uint8_t kModelColumnSigns = 0x40;

// Chunk byte 0, bit 7: the rates are capped at 2^Rate_Cap, a header byte: a weight so small that
// its rate would promise a change in most steps changes in about half of them on the corpus (its
// sign hovers around zero), and the rates above that only blur the blocks' rate sums. Without it
// the cap is kMaxRateLog.
constexpr uint8_t kModelRateCap = 0x80;

// A modelled chunk's adaptive probabilities after its last decision. A session keeps one
// per chunk, so that the chunk's next step starts where this one ended instead of learning
// its probabilities again (the rates change little from step to step).
struct ModelState;
struct ModelStateDeleter {
  void operator()(ModelState* state) const;
};
using ModelStatePtr = std::unique_ptr<ModelState, ModelStateDeleter>;

// Where a chunk's contexts start and where they end (both optional). Encoder and decoder
// of the same chunk end on the same state.
struct CarriedModel {
  const ModelState* start = nullptr;  // set: code the chunk from it (kModelCarried)
  ModelStatePtr* end = nullptr;       // set: receives the state the chunk ends on
};

// Largest chunk the modelled coder accepts, in elements.
constexpr size_t kMaxModelledChunk = size_t{1} << 24;

// MonotoneKey / FromMonotoneKey (the monotone integer order of BF16 bit patterns) live in
// src/codec/kernels.h, beside the history kernel that uses them too.

// Session history (optional): one byte per element that sender and receiver both keep
// across the steps of a session, so that the coder can use what changed before (an
// element that changed in the previous step is several times likelier to change again,
// almost always in the same direction). Bits 0-2: age of the element's last
// change (0: none recorded, 1: the previous step, ..., 7: seven or more steps ago);
// bit 3: that change went up (in MonotoneKey order); bits 4-7: unused (ignored).
// A new session starts from all zeros; after each step both sides call AdvanceHistory
// (a kernel, src/codec/kernels.h, with the constants kHistoryAgeMask and kHistoryUp, and
// IsRecent for ages 1-2) with the step's src and dst.

// Appends the modelled coding of one chunk (len <= kMaxModelledChunk elements) to out.
// Only positions where src and dst differ are coded; a chunk without changes is 0 bytes.
// `history`: the session history of the chunk's elements, or nullptr (stateless). The
// bytes are deterministic. `changes`: the number of elements that differ, if the caller
// counted them already (ClassifyChanges), else kUncounted. `carried`: see CarriedModel
// (its `end` is left alone for a chunk without changes). `sign_periods`: row lengths to
// try for column signs (ascending, each in [1, 65535]), or nullptr for none; the chunk
// uses the one that saves most, if any saves its header bytes (SignPeriodCandidates).
// @return ok, or kInvalidArgument (null pointer with len > 0, len too large).
constexpr uint64_t kUncounted = ~uint64_t{0};
Status EncodeChunkModelled(const uint16_t* src, const uint16_t* dst, size_t len,
                           std::vector<uint8_t>* out, const uint8_t* history = nullptr,
                           uint64_t changes = kUncounted,
                           const CarriedModel& carried = CarriedModel(),
                           const std::vector<uint32_t>* sign_periods = nullptr);

// The sign periods worth trying for a chunk that lies mostly in a tensor of `elements`
// elements: its divisors in [8, 65535] (its possible row lengths) below `elements`, and 1
// (one counter for the whole chunk), ascending.
std::vector<uint32_t> SignPeriodCandidates(uint64_t elements);

// As above with a forced block size 2^log2_block, log2_block in [kMinModelBlockLog,
// kMaxModelBlockLog] (for measurements; EncodeChunkModelled picks it from the density).
constexpr int kMinModelBlockLog = 2;
constexpr int kMaxModelBlockLog = 8;
Status EncodeChunkModelledWithBlock(const uint16_t* src, const uint16_t* dst, size_t len,
                                    int log2_block, std::vector<uint8_t>* out,
                                    const uint8_t* history = nullptr);

// Decodes a chunk written by EncodeChunkModelled for the same `src`, `len` and history:
// replaces the contents of `positions` (ascending, < len) and `xors` (src[pos] ^ dst[pos],
// never 0). The input is untrusted: any bytes give either a result or kCorruptChunk /
// kTruncated, never a read outside [bytes, bytes + size) nor a write outside the vectors.
// All `size` bytes must belong to the chunk (trailing bytes are an error). A chunk coded
// with history needs `history` (kCorruptChunk without); one coded without ignores it.
// A chunk coded from a carried model needs `carried.start` (kCorruptChunk without).
// A wrong src, history or carried model gives a wrong result, not an error: the frame's
// checksum catches it.
// @return ok, kInvalidArgument (null pointers, len too large), kTruncated, kCorruptChunk.
Status DecodeChunkModelled(const uint16_t* src, size_t len, const uint8_t* bytes, size_t size,
                           std::vector<uint32_t>* positions, std::vector<uint16_t>* xors,
                           const uint8_t* history = nullptr,
                           const CarriedModel& carried = CarriedModel());

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_MODEL_CODER_H_

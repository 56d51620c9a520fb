// arc_v3: lossless compression of BF16 weight-update deltas.
//
// This is the only header users include. It has no Highway, zstd or lz4 in it; the
// implementation lives in src/ and is linked as the Bazel target //:arc_v3 (or the CMake
// target arc_v3::arc_v3).
//
// Usage (the C++ twin of the published Python API):
//
//   arc_v3::Delta delta;
//   arc_v3::Status s = arc_v3::delta_compress(prev, next, count, &delta);
//   ... send delta.bytes and delta.checksum ...
//   s = arc_v3::delta_decompress(prev, count, delta.bytes.data(), delta.bytes.size(),
//                                delta.checksum, restored);
//
// `prev`, `next` and `restored` are BF16 bit patterns (uint16_t, host order = little
// endian). The payload format is specified in src/codec/FORMAT.md.
//
// Guarantees:
// - Lossless: every bit pattern round-trips (NaN payloads, +-Inf, denormals, -0).
// - Errors are returned as Status, never thrown; nothing aborts on bad input.
// - The decoder validates every field before use, never reads outside `bytes` nor writes
//   outside `out`, and verifies XXH3-64 of the result against `checksum`. On any error,
//   `out` is left exactly as it was (also when `out == src`).
// - The payload bytes do not depend on the SIMD target, thread count or machine.
#ifndef ARC_V3_HPP_7193046521
#define ARC_V3_HPP_7193046521

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

//------------------------------------------------------------------------------
// Version
#define ARC_V3_VERSION_MAJOR 2
#define ARC_V3_VERSION_MINOR 0
#define ARC_V3_VERSION_PATCH 0
#define ARC_V3_VERSION_NUMBER \
  (ARC_V3_VERSION_MAJOR * 10000 + ARC_V3_VERSION_MINOR * 100 + ARC_V3_VERSION_PATCH)

namespace arc_v3 {

// The library's version (may differ from the header's ARC_V3_VERSION_NUMBER if the
// library was rebuilt separately), e.g. 20000 for 2.0.0.
uint32_t VersionNumber();
// "2.0.0".
const char* VersionString();
// The payload format version this library writes by default (Format::kDefault) and reads
// (src/codec/FORMAT.md): 16. It also writes and reads version 1, ARCv3 as published.
uint32_t FormatVersion();

//------------------------------------------------------------------------------
// Errors: one enum that every layer shares (the codec, arc_v3_checkpoint.hpp and
// arc_v3_sync.hpp), so that a Status passes up the layers unchanged and a caller handles one
// set of codes. Each code is listed with the layers that return it. Values are stable:
// never renumbered, only appended.
enum class ErrorCode : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,     // null pointer with a nonzero count, bad option value
  kSizeMismatch = 2,        // element count differs from the payload's
  kTruncated = 3,           // payload ends before its fields do
  kBadMagic = 4,            // not an arc_v3 payload
  kUnsupportedVersion = 5,  // a format version this library does not read
  kReservedBitsSet = 6,     // a reserved field is nonzero
  kCorruptHeader = 7,       // frame header or chunk table inconsistent
  kCorruptChunk = 8,        // a chunk's streams are inconsistent
  kCodecFailure = 9,        // zstd / lz4 failed on a stream
  kChecksumMismatch = 10,   // result differs from the checksum: wrong src or corrupt payload
  kOutputTooSmall = 11,     // out has room for fewer elements than the payload holds
  kOutOfMemory = 12,
  kInternal = 13,         // a bug; please report
  kWrongBase = 14,        // a session payload was made from another base than src
  kHistoryMismatch = 15,  // session payload vs. stateless call, or sessions out of step
  // The sync layer's (arc_v3_sync.hpp: object stores and the protocol); the codes above
  // are every layer's.
  kNotFound = 16,          // no such object, step or file
  kAlreadyExists = 17,     // a write-once object exists with other contents
  kUnavailable = 18,       // the store cannot be reached or keeps failing (after retries)
  kPermissionDenied = 19,  // the store refused the credentials or the request
  // A signed step that fails its trust rules: unsigned, signed by an untrusted key, a
  // digest that differs, another run, or older than the step held.
  kUntrusted = 20,
  // A local file could not be read, written, synced, resized or renamed (a full disk, a
  // failing device, permissions): the checkpoint and sync layers'.
  kIoError = 21,
  kMaxCode = 22  // sentinel: never returned, may grow
};

// Stable name of an error code, e.g. "checksum_mismatch".
const char* ErrorName(ErrorCode code);

// [[nodiscard]]: a Status that is dropped unread is a warning; (void) says it was meant.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  // Human-readable explanation ("" when ok).
  const std::string& message() const { return message_; }
  // "ok" or "<error name>: <message>".
  std::string ToString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

//------------------------------------------------------------------------------
// Options

// Payload formats this library writes; it reads both. Both are frozen: a payload written
// by any 1.x library decodes with every later one.
enum class Format : uint8_t {
  kDefault = 0,    // format version 16 (src/codec/FORMAT.md): the smallest payloads
  kPublished = 1,  // format version 1, ARCv3 as published: XOR fields, 7-bit mantissas
  kArcV3 [[deprecated("Format::kArcV3 is now Format::kPublished")]] = 1,
};

// The effort every layer codes with unless told otherwise (Options, the checkpoint and sync
// layers, the command line, Python).
constexpr int kDefaultEffort = 2;

struct Options {
  Format format = Format::kDefault;
  // 0 (fastest) .. 3 (smallest). With kDefault: 0 codes XOR streams (ARCv3's fields);
  // 1-2 code dense chunks (>= 2048 changes, >= 1/128 changed; 1/64 in a session) with the
  // rANS coder and the rest with the context-modelled coder; 3 codes all three and keeps
  // the smallest. Also sets how many compressors race for XOR streams. The decoder reads
  // every effort's payloads alike.
  int effort = kDefaultEffort;
  // Worker threads; 0 = all hardware threads. Output bytes do not depend on it.
  int threads = 0;
  // Elements per independently coded chunk: a power of two in [2^10, 2^24]. Where the
  // elements would fill one chunk and an eighth of another at most, the encoder codes them
  // as one chunk of twice the size instead (a small last chunk costs its own header).
  uint32_t chunk_elements = 1u << 20;
};

//------------------------------------------------------------------------------
// Stable API

// The result of delta_compress: payload bytes plus XXH3-64 (seed 0) of dst's bytes.
struct Delta {
  std::vector<uint8_t> bytes;
  uint64_t checksum = 0;
};

// Encodes the change from `src` (previous weights) to `dst` (new weights), `count`
// BF16 bit patterns each. `out` is overwritten.
// @return ok, or kInvalidArgument (null pointers with count > 0, bad options),
//         kOutOfMemory.
Status delta_compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out,
                      const Options& options = Options());
// As above, and sets *src_checksum to Checksum(src, count) (below), computed as src is read
// for encoding: a caller that records its base's checksum saves a pass over it.
Status delta_compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out,
                      const Options& options, uint64_t* src_checksum);

// Rebuilds dst from `src` (count elements) and a payload, writing `count` elements to
// `out`. `out` may equal `src` (apply in place); otherwise the two must not overlap.
// The result is verified against `checksum` (XXH3-64 of dst's bytes).
// @return ok, or an error; on error `out` is unchanged.
Status delta_decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                        uint64_t checksum, uint16_t* out);

// As above, with the capacity of `out` (in elements) checked: kSizeMismatch when `count`
// differs from the payload's count, kOutputTooSmall when it exceeds `out_capacity`.
// `threads`: 0 = all hardware threads.
Status delta_decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                        uint64_t checksum, uint16_t* out, size_t out_capacity, int threads = 0);

// Convenience overloads on vectors.
Status delta_compress(const std::vector<uint16_t>& src, const std::vector<uint16_t>& dst,
                      Delta* out, const Options& options = Options());
Status delta_decompress(const std::vector<uint16_t>& src, const Delta& delta,
                        std::vector<uint16_t>* out);

// Several tensors in one payload, coded as their concatenation (chunks run across tensor
// boundaries); the checksum is XXH3-64 of the concatenated dst bytes. Small tensors
// (norms, biases) save their own frame header and the learning of their own contexts;
// delta_worth_grouping says which to group. Tensors that lie back to back in memory are
// read and written in place; otherwise the calls copy them into one buffer (and the
// decoder builds the result there before writing any `out`).
struct TensorDelta {
  const uint16_t* src = nullptr;  // previous weights, `count` BF16 values
  const uint16_t* dst = nullptr;  // new weights
  size_t count = 0;
};
// @return ok, or kInvalidArgument (null pointers with count > 0, bad options,
//         Format::kPublished), kOutOfMemory.
Status delta_compress_tensors(const TensorDelta* tensors, size_t tensor_count, Delta* out,
                              const Options& options = Options());

// Whether a tensor should share a stateless payload with others (delta_compress_tensors)
// rather than have its own: fewer than kGroupBelowElements elements and fewer than
// kGroupMaxChanges of them changed (a tensor with more changes codes best with
// probabilities fitted to it alone). Reads src and dst in one pass that stops at the
// threshold; false for null pointers. Sessions group by size instead: a Session's tensors
// must stay the same from step to step.
constexpr size_t kGroupBelowElements = size_t{1} << 20;
constexpr size_t kGroupMaxChanges = 16384;
bool delta_worth_grouping(const uint16_t* src, const uint16_t* dst, size_t count);

struct TensorOut {
  const uint16_t* src = nullptr;  // the base the payload was made from
  uint16_t* out = nullptr;        // receives the new weights; may equal src
  size_t count = 0;
};
// Rebuilds every tensor of a payload of delta_compress_tensors (or of delta_compress,
// as a list of one). The tensors must be passed in the order they were coded, with the
// same counts (else kSizeMismatch, naming the tensor). Each `out` may equal its own
// `src`; otherwise it must not overlap any tensor's src or out. All or nothing: on error
// no `out` is written.
// `threads`: 0 = all hardware threads.
Status delta_decompress_tensors(const TensorOut* tensors, size_t tensor_count, const uint8_t* bytes,
                                size_t size, uint64_t checksum, int threads = 0);

// What a payload's header says, read without decoding it. Fields from untrusted input:
// the element count may be a lie until delta_decompress has verified the checksum.
struct PayloadInfo {
  uint32_t format_version = 0;
  uint64_t element_count = 0;
  uint32_t chunk_elements = 0;
  uint64_t chunk_count = 0;
  // Tensors of a delta_compress_tensors payload, else 1. The payload holds only a check of
  // their element counts: the decoder is handed the tensors and checks them against it.
  uint64_t tensor_count = 1;
  bool session = false;  // made by an arc_v3::Session
  // A session payload that continues its session's last step: its base and its tensors
  // are that step's result and tensors, which the payload does not repeat (for a group,
  // tensor_count is 0).
  bool continues = false;
};
Status delta_inspect(const uint8_t* bytes, size_t size, PayloadInfo* info);

// Per-payload statistics for tools and benchmarks.
struct PayloadStats {
  PayloadInfo info;
  // Chunks by coding: [nothing changed, XOR streams (ARCv3), context-modelled, rANS,
  // rANS with a session history].
  uint64_t chunk_modes[5] = {0, 0, 0, 0, 0};
  // False when modelled or rANS chunks were not decoded because no base was given (or,
  // for modelled and rANS chunks of a session payload, no history): then
  // `changed` and `exponent_or_sign` count only the other chunks.
  bool counts_known = true;
  uint64_t changed = 0;           // elements whose bits differ
  uint64_t exponent_or_sign = 0;  // of those, with a changed sign or exponent field
  // Bytes by kind, summed over chunks, as stored (after compression); they add up to the
  // payload size.
  uint64_t position_bytes = 0, mantissa_bytes = 0, high_bytes = 0;  // XOR streams
  uint64_t modelled_bytes = 0;                                      // context-modelled chunks
  uint64_t rans_bytes = 0;                                          // rANS chunks
  uint64_t overhead_bytes = 0;  // frame header, chunk table, chunk and stream headers
  // How often each compressor won an XOR stream: [stored, lz4, zstd].
  uint64_t codec_wins[3] = {0, 0, 0};
};
// Decodes the payload's structure without the base: modelled and rANS chunks are
// measured but their changes not counted (counts_known = false if there are any).
Status delta_stats(const uint8_t* bytes, size_t size, PayloadStats* stats);
// With the base (`src`, `count` elements), every chunk is decoded and counted.
Status delta_stats(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                   PayloadStats* stats);

//------------------------------------------------------------------------------
// Sessions (opt-in): stateful coding of one tensor's sequence of deltas.
//
// Both sides keep one Session per tensor (or group): the sender calls Compress for every
// step, the receiver Decompress for the same steps in the same order. Each side remembers,
// per element, how long ago it last changed and in which direction (1 byte per element),
// and, per chunk of the adaptive coder, the probabilities it ended on (~9 KB per 2^20
// elements); the coder uses both as context, so session payloads are smaller than
// stateless ones. Each payload names the base it was made from and the session history
// it expects: a receiver with the wrong base (kWrongBase) or out of step
// (kHistoryMismatch: a missed, repeated or foreign payload) gets a clear error, never
// wrong weights, and its state is unchanged after any error. A step whose src is the
// last step's result, over the same tensors, refers to that step instead of naming them.
// Session payloads are decoded only by Session::Decompress; delta_decompress rejects
// them.
class Session {
 public:
  explicit Session(const Options& options = Options());
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Sender: codes src -> dst with the history, then advances the history.
  Status Compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out);
  // Receiver: rebuilds dst (out may equal src), then advances the history.
  Status Decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                    uint64_t checksum, uint16_t* out);

  // The same for a group of tensors in one payload per step (as delta_compress_tensors):
  // one Session for many small tensors, or a whole model. The history covers the tensors'
  // concatenation: pass the same tensors, in the same order, at every step.
  Status CompressTensors(const TensorDelta* tensors, size_t tensor_count, Delta* out);
  Status DecompressTensors(const TensorOut* tensors, size_t tensor_count, const uint8_t* bytes,
                           size_t size, uint64_t checksum);

  // Steps coded or decoded so far, and the identity of the history (equal on both sides
  // when they are in step).
  uint64_t steps() const;
  uint64_t history_id() const;
  // Forgets the history (both sides must reset together).
  void Reset();

 private:
  struct State;
  State* state_;
};

// XXH3-64 (seed 0) of `count` BF16 values' bytes: the checksum delta_compress reports.
uint64_t Checksum(const uint16_t* values, size_t count);

// Name of the SIMD target the kernels dispatch to on this machine, e.g. "AVX3".
const char* ActiveTarget();

}  // namespace arc_v3

#endif  // ARC_V3_HPP_7193046521

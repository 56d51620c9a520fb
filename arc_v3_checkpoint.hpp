// arc_v3 checkpoint deltas: the delta between two checkpoints as one checkpoint delta
// container (src/checkpoint/FORMAT.md), from safetensors files or sharded checkpoint
// directories (DiffCheckpoints, ApplyDelta: what `arc_v3 diff` and `apply` run) or from
// state dicts in memory (StateDictDiff, StateDictApply: the same bytes as for the two
// saved as single safetensors files). BF16 tensors are coded with the codec of arc_v3.hpp;
// other dtypes, new tensors and changed shapes travel whole.
//
// Bazel: //:arc_v3_checkpoint. Thread-safe: calls share no state.
#ifndef ARC_V3_CHECKPOINT_HPP_
#define ARC_V3_CHECKPOINT_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {

// A tensor in caller memory; dtype is a safetensors dtype name ("BF16", "F32", "I64", ...).
struct NamedTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  const void* data = nullptr;  // C order, little endian; dtype size x product(shape) bytes
};

// Bytes per element of a safetensors dtype name; 0 for a name it does not know.
size_t DtypeSize(const std::string& dtype);

// The first bytes of every checkpoint delta container.
constexpr char kDeltaMagic[4] = {'A', '3', 'D', 'C'};

struct StateDictOptions {
  Format format = Format::kDefault;
  int effort = kDefaultEffort;  // codec effort 0..3 (Options::effort) for the BF16 tensors
  int threads = 0;              // 0: all cores; the bytes do not depend on it
};

// The delta of `next` against `prev` (tensors matched by name; each list names a tensor
// once). Errors: kInvalidArgument (an unknown dtype, a size that is not dtype x shape, a
// name twice), kOutOfMemory.
Status StateDictDiff(const std::vector<NamedTensor>& prev, const std::vector<NamedTensor>& next,
                     const StateDictOptions& options, std::vector<uint8_t>* delta);

// Memory for one rebuilt tensor: sets *data to a writable buffer of `bytes` bytes (dtype
// size x product(shape)) that stays valid until the apply returns (the caller keeps it
// after), or returns an error that stops the apply. Called on the calling thread, before
// any decoding.
using TensorAllocator =
    std::function<Status(const std::string& name, const std::string& dtype,
                         const std::vector<uint64_t>& shape, uint64_t bytes, void** data)>;

// Rebuilds the state dict a StateDictDiff delta leads to from `prev` (read only) into
// memory from `allocate`; `next` receives the rebuilt tensors in the delta's order (a
// tensor of no bytes gets no allocate call and a null data).
// Every piece is verified against the checksums the delta records, the target's safetensors
// header included. On error `next` is left empty and nothing allocated holds a valid
// tensor. Errors: the codec's decoding codes (kTruncated, kBadMagic, kChecksumMismatch,
// ...); kInvalidArgument for a delta of a sharded checkpoint directory;
// kChecksumMismatch where `prev` is not the state dict the delta was made from.
Status StateDictApply(const std::vector<NamedTensor>& prev, const uint8_t* delta, size_t size,
                      const TensorAllocator& allocate, int threads, std::vector<NamedTensor>* next);

// --- Checkpoint files ---
// A checkpoint is one .safetensors file or a directory of them (a sharded checkpoint;
// model.safetensors.index.json travels along). Inputs are memory-mapped and pieces coded
// in parallel; every output is written beside its final path, synced and renamed, so an
// error or a kill never leaves a half-written file under a final name.

struct CheckpointOptions {
  int threads = 0;  // 0: all cores; the bytes do not depend on it
  // Codec effort 0..3 (Options::effort) and format of BF16 pieces in a diff (an apply
  // reads every format).
  int effort = kDefaultEffort;
  Format format = Format::kDefault;
  // A diff codes the small BF16 tensors in groups (container version 2). Off: every
  // tensor its own payloads, a version-1 container for readers older than 1.0.
  bool group = true;
  // A diff stores pieces by the share of their tensor's rows they start at, so that a
  // reader of rows [0, B) of every tensor (a tensor-parallel rank) fetches one range.
  bool row_order = false;
  bool sync = true;  // fsync outputs before renaming them (off only for benchmarks)
  // Outputs that exist are replaced (an in-place apply always replaces); off, an existing
  // output is kAlreadyExists before any work.
  bool overwrite = true;
  // Bytes of tensor data processed so far / in all, updated as pieces finish (may be null).
  std::atomic<uint64_t>* progress_done = nullptr;
  std::atomic<uint64_t>* progress_total = nullptr;
};

struct CheckpointReport {
  uint64_t files = 0, tensors = 0, pieces = 0;  // pieces: groups included
  uint64_t target_bytes = 0;                    // of the checkpoint produced or described
  uint64_t delta_bytes = 0;
  std::vector<std::string> written;  // output paths
  // Apply: decoding (checksums verified) and writing, summed over threads; the final sync
  // and renames (wall clock).
  double decode_seconds = 0, write_seconds = 0, sync_seconds = 0;
};

// Writes the delta from checkpoint `prev` to `next` (both files or both directories) to
// `delta_path`. An empty `prev` writes an anchor: every tensor whole, needing no base.
// Errors: kInvalidArgument (missing or malformed inputs), kAlreadyExists (see overwrite).
Status DiffCheckpoints(const std::string& prev, const std::string& next,
                       const std::string& delta_path, const CheckpointOptions& options,
                       CheckpointReport* report);

// Rebuilds the checkpoint `delta_path` leads to from `prev` into `out`: a file (or a
// directory to put it in) for the delta of a file, a directory (created if needed) for a
// sharded one; `out` == `prev` applies in place; an empty `prev` applies an anchor. Every
// piece is verified before it is written; on error no output changes. Errors:
// kChecksumMismatch naming the tensor (a wrong base), kTruncated, kBadMagic, kCorrupt*, ...
Status ApplyDelta(const std::string& prev, const std::string& delta_path, const std::string& out,
                  const CheckpointOptions& options, CheckpointReport* report);

// Partial apply into a new safetensors file `out_path`: the target tensors whose whole
// name matches the ECMAScript regex `tensor_regex`, cut to rows [row_begin, row_end) of
// their first dimension (rank-0 tensors whole). Reads only the pieces they overlap, and
// checks only the base rows those cover.
Status ApplyDeltaPart(const std::string& prev, const std::string& delta_path,
                      const std::string& tensor_regex, uint64_t row_begin, uint64_t row_end,
                      const std::string& out_path, const CheckpointOptions& options,
                      CheckpointReport* report);

// Checks that `prev` is the base of `delta_path` and that every piece decodes and verifies;
// writes nothing.
Status VerifyDelta(const std::string& prev, const std::string& delta_path,
                   const CheckpointOptions& options, CheckpointReport* report);

// --- What a delta holds ---

// The chunks of arc_v3 payloads by the coder each chose (src/codec/FORMAT.md, "Chunk").
struct ArcV3Chunks {
  uint64_t unchanged = 0, xor_streams = 0, modelled = 0, rans = 0, rans_history = 0;
};

// One tensor of a delta.
struct DeltaTensorInfo {
  std::string name;
  std::string kind;  // "delta" (coded against the base), "added" or "reshaped" (carried whole)
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<std::string> coders;   // per stored piece; a grouped tensor: its group's ("arc_v3")
  int64_t group = -1;                // its index in DeltaInfo::groups, or -1
  uint64_t elements = 0, bytes = 0;  // of the target tensor
  uint64_t pieces = 0;
  uint64_t delta_bytes = 0;  // of its pieces (0 for a grouped tensor: see its group)
  // Its coders in short, an arc_v3 payload's by the chunk coders it chose
  // ("arc_v3:rans+modelled", "zstd").
  std::string coder_summary;
  // Its arc_v3 payloads (alone or its group's) were read: `chunks` is known, and `high`
  // with `changed`.
  bool chunks_known = false;
  ArcV3Chunks chunks;
  // A "delta" tensor's changed elements, and of them those whose sign or exponent changed
  // (`high`, arc_v3 payloads only). Known (`changes_known`) where the manifest or the
  // payloads say; context-modelled chunks need the base.
  bool changes_known = false;
  uint64_t changed = 0, high = 0;
};

// One group: small BF16 tensors of a file coded as one arc_v3 payload.
struct DeltaGroupInfo {
  std::string file;  // the checkpoint file its members are in
  uint64_t tensors = 0, elements = 0, delta_bytes = 0;
  bool chunks_known = false;  // its payload was read: `chunks` is known
  ArcV3Chunks chunks;
  std::string coder_summary;   // "arc_v3:rans+modelled", or "arc_v3" where not read
  bool changes_known = false;  // counted on the decoded group (InspectDeltaFile with a base)
  uint64_t changed = 0;
};

// What a delta holds, from its checked manifest (and, InspectDeltaFile, its payloads).
struct DeltaInfo {
  bool directory = false;  // the delta of a sharded checkpoint directory
  uint32_t container_version = 0;
  uint64_t files = 0;                            // checkpoint files it rebuilds
  uint64_t delta_bytes = 0, manifest_bytes = 0;  // the container's, and its manifest's
  std::vector<DeltaTensorInfo> tensors;          // by file, in manifest order
  std::vector<DeltaGroupInfo> groups;
  std::vector<std::string> removed_tensors, removed_files;
};

// Inspects a delta in memory from its checked manifest alone: no payload is read (chunk
// counts unknown; changes known only where the manifest records them).
Status InspectDelta(const uint8_t* delta, size_t size, DeltaInfo* info);
// Inspects the delta file `delta_path`, its payloads read (their chunk coders and the
// changes they say); with `base_path` (the checkpoint it applies to; "": none) it also
// decodes what must be decoded to count every change. Errors: the
// container's (naming the file), a piece's (naming its tensor), kChecksumMismatch for a
// base that is not the one the delta was made from.
Status InspectDeltaFile(const std::string& delta_path, const std::string& base_path, int threads,
                        DeltaInfo* info);

}  // namespace arc_v3

#endif  // ARC_V3_CHECKPOINT_HPP_

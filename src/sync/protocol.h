// The sync protocol's objects and documents (src/FORMAT.md, Part 3): where a step's
// pieces live in a store, the shard records and step manifests that describe them, and the
// `latest` pointer. Parsers validate every field; a document that breaks a rule is
// kCorruptHeader, naming the key.
#ifndef ARC_V3_SRC_SYNC_PROTOCOL_H_
#define ARC_V3_SRC_SYNC_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

constexpr char kProtocolName[] = "arc_v3-sync";
constexpr uint32_t kProtocolVersion = 1;
constexpr uint64_t kNoStep = UINT64_MAX;
// Steps are numbered below 10^12 (12 digits in keys), shards below 10^5.
constexpr uint64_t kMaxStep = 999999999999ull;
constexpr uint32_t kMaxShards = 99999;
// The most bytes a reader accepts for a record, manifest or pointer.
constexpr uint64_t kMaxDocumentBytes = uint64_t{64} << 20;

constexpr char kLatestKey[] = "latest";
std::string StepPrefix(uint64_t step);  // "steps/000000000042/"
std::string ManifestKey(uint64_t step);  // "steps/000000000042/manifest.json"
// "steps/000000000042/shard-00001-of-00004.json"
std::string ShardRecordKey(uint64_t step, uint32_t shard, uint32_t count);
// "steps/000000000042/shard-00001-of-00004.delta-0123456789abcdef.a3d": named by the
// object's XXH3, so an object never changes once written.
std::string PieceKey(uint64_t step, uint32_t shard, uint32_t count, const char* kind, uint64_t xxh3);
// "steps/000000000042/shard-00001-of-00004.index-0123456789abcdef.json": the shard's
// model.safetensors.index.json, named by its XXH3.
std::string IndexKey(uint64_t step, uint32_t shard, uint32_t count, uint64_t xxh3);
constexpr char kIndexFileName[] = "model.safetensors.index.json";
// The step a key under "steps/" belongs to, or kNoStep.
uint64_t StepOfKey(const std::string& key);

// One uploaded delta container (src/FORMAT.md, Part 2).
struct ObjectRef {
  std::string key;  // empty: absent
  uint64_t size = 0;
  uint64_t xxh3 = 0;       // of all `size` bytes
  uint64_t head_size = 0;  // the container's header and manifest: bytes [0, head_size)
  uint64_t head_xxh3 = 0;  // of those bytes; the manifest in turn checks every piece
  bool present() const { return !key.empty(); }
};

struct TensorChecksum {
  std::string name;
  uint64_t xxh3 = 0;  // the tensor's result checksum (TensorResultChecksum)
};

// What one trainer shard published for a step: its file rebuilt as a delta against the
// same shard's file of `base_step`, and/or as an anchor (against nothing).
struct ShardRecord {
  uint64_t step = 0;
  uint64_t base_step = kNoStep;  // kNoStep: no delta
  uint32_t shard = 0, count = 1;
  std::string file;  // the published file's name
  uint64_t file_size = 0;
  ObjectRef delta, anchor;  // at least one present; delta iff base_step != kNoStep
  // The sharded checkpoint's model.safetensors.index.json beside the file, carried to
  // regions verbatim (key, size and xxh3 only; absent: none).
  ObjectRef index;
  std::vector<TensorChecksum> tensors;  // in file order
  double published_at = 0;  // Unix time the shard started publishing (informative)
};

// A committed step: every shard's record, in shard order.
struct StepManifest {
  uint64_t step = 0;
  uint64_t base_step = kNoStep;  // of every shard that has a delta
  // XXH3 of the base step's manifest bytes (0: none; a step whose every shard has an
  // anchor may be committed before its base): a region at the base step checks the link
  // without reading the base's manifest again.
  uint64_t base_manifest_xxh3 = 0;
  uint64_t anchor_step = 0;      // the nearest step at or before this one on its chain
                                 // whose every shard has an anchor
  uint32_t count = 1;
  std::vector<ShardRecord> shards;
  double published_at = 0;  // the earliest shard's
  double committed_at = 0;
  bool anchor() const { return anchor_step == step; }
  // The step's model.safetensors.index.json: the lowest shard's that carries one, or null.
  const ObjectRef* index() const {
    for (const ShardRecord& r : shards) {
      if (r.index.present()) return &r.index;
    }
    return nullptr;
  }
};

std::string RecordJson(const ShardRecord& record);
std::string ManifestJson(const StepManifest& manifest);
std::string LatestJson(uint64_t step);
// `where` names the document in errors (its URL).
Status ParseRecord(const std::vector<uint8_t>& bytes, const std::string& where, ShardRecord* record);
Status ParseManifest(const std::vector<uint8_t>& bytes, const std::string& where, StepManifest* manifest);
Status ParseLatest(const std::vector<uint8_t>& bytes, const std::string& where, uint64_t* step);

// Whether two records describe the same published bytes (published_at aside).
bool SameContents(const ShardRecord& a, const ShardRecord& b);

// Reads a step's manifest (kNotFound: the step does not exist) and checks it is the
// step asked for.
Status ReadManifest(Store* store, uint64_t step, StepManifest* manifest, std::vector<uint8_t>* bytes);
// Reads the `latest` pointer: kNotFound if nothing was committed yet.
Status ReadLatest(Store* store, uint64_t* step, std::string* etag);
// The newest committed step from `from` on: `from` itself, or a later step whose manifest
// exists (the pointer is a hint that a racing commit may leave one step behind; at most
// `probes` manifests are looked for).
uint64_t ProbeLater(Store* store, uint64_t from, int probes = 16);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_PROTOCOL_H_

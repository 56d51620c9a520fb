// The sync protocol's objects and documents (src/sync/PROTOCOL.md, version 2): where a
// step's pieces live in a store, and the documents that describe them: shard records, the
// group indexes and layouts a completion tree writes over them, the step root that commits
// a step, and the `latest` pointer. Parsers validate every field; a document that breaks a
// rule is kCorruptHeader, naming the key. Pure: no I/O (step_reader.h reads a step from a
// store).
#ifndef ARC_V3_SRC_SYNC_PROTOCOL_H_
#define ARC_V3_SRC_SYNC_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/signing.h"

namespace arc_v3 {
namespace checkpoint {
struct Manifest;
struct TensorEntry;
}  // namespace checkpoint
namespace sync {

constexpr char kProtocolName[] = "arc_v3-sync";
constexpr uint32_t kProtocolVersion = 2;
constexpr uint64_t kNoStep = UINT64_MAX;
// Steps are numbered below 10^12 (12 digits in keys), shards below 10^5.
constexpr uint64_t kMaxStep = 999999999999ull;
constexpr uint32_t kMaxShards = 99999;
// Shards complete a step in groups of this many: the last shard of a group writes its
// group index, the last group the step root.
constexpr uint32_t kFanIn = 32;
// The most bytes a reader accepts for a document.
constexpr uint64_t kMaxDocumentBytes = uint64_t{64} << 20;
constexpr char kDefaultIncarnation[] = "0";
// The DSSE payload type of a signed document (SIGNED_STEPS.md, "Signed steps").
constexpr char kSignedType[] = "application/vnd.arc-v3.sync+json";

// A document stored as a DSSE envelope (signed), or plain (null).
using Signatures = std::shared_ptr<const Envelope>;

inline uint32_t GroupOf(uint32_t shard) { return shard / kFanIn; }
inline uint32_t GroupCount(uint32_t count) { return (count + kFanIn - 1) / kFanIn; }

// Keys (PROTOCOL.md, "Object layout"). HH: two hex digits that spread a step's objects over
// 256 key prefixes.
constexpr char kLatestKey[] = "latest";
std::string RootKey(uint64_t step);  // "steps/000000000042.json"
// "groups/000000000042/00004/INC/": a step's group indexes of one incarnation.
std::string GroupIndexPrefix(uint64_t step, uint32_t count, const std::string& incarnation);
std::string GroupIndexKey(uint64_t step, uint32_t count, const std::string& incarnation,
                          uint32_t group);
// "r/HH/000000000042-00004-00000/INC/": a group's shard records of one incarnation.
std::string GroupRecordPrefix(uint64_t step, uint32_t count, const std::string& incarnation,
                              uint32_t group);
std::string ShardRecordKey(uint64_t step, uint32_t shard, uint32_t count,
                           const std::string& incarnation);
// "o/HH/000000000042-00004-00001/delta-0123456789abcdef.a3d": named by the object's XXH3,
// so an object never changes once written.
std::string PieceKey(uint64_t step, uint32_t shard, uint32_t count, const char* kind,
                     uint64_t xxh3);
// "o/HH/000000000042-00004-00001/index-0123456789abcdef.json": the shard's
// model.safetensors.index.json, named by its XXH3.
std::string IndexKey(uint64_t step, uint32_t shard, uint32_t count, uint64_t xxh3);
// "l/HH/0123456789abcdef.json": a group's layout, named by its XXH3 (shared by steps).
std::string LayoutKey(uint64_t xxh3);
constexpr char kIndexFileName[] = "model.safetensors.index.json";
// The step an object of a step belongs to (roots, group indexes, records, objects), or
// kNoStep (latest, layouts, anything else).
uint64_t StepOfKey(const std::string& key);
// Whether `name` may name an incarnation: 1 to 64 of [A-Za-z0-9._-], not "." or "..".
bool ValidIncarnation(const std::string& name);

// One uploaded object: a container (src/checkpoint/FORMAT.md) or an index file.
struct ObjectRef {
  std::string key;  // empty: absent
  uint64_t size = 0;
  uint64_t xxh3 = 0;       // of all `size` bytes
  uint64_t head_size = 0;  // the container's header and manifest: bytes [0, head_size)
  uint64_t head_xxh3 = 0;  // of those bytes; the manifest in turn checks every piece
  // Signed records only (else empty), SHA-256 in hex: of all bytes, of the head, and of
  // the object's piece digests (SumsKey: a SHA-256 per data-section range, in order).
  std::string sha256, head_sha256, sums_sha256;
  uint64_t sums_size = 0;
  bool present() const { return !key.empty(); }
};
// "o/.../delta-H16.sha256": the piece digests of the container at `key`.
std::string SumsKey(const std::string& key);
// The ranges of a container's data section whose digests its sums object lists, in order:
// every non-empty piece (files' headers and fills, ungrouped tensors' pieces) and group,
// as (offset from the data section's start, size), by offset.
std::vector<std::pair<uint64_t, uint64_t>> StoredRanges(const checkpoint::Manifest& manifest);

struct TensorChecksum {
  std::string name;
  uint64_t xxh3 = 0;  // the tensor's result checksum (TensorResultChecksum)
};
// A file's tensor-list checksum (PROTOCOL.md, Documents) of its tensors in data-section
// order: what a record holds of them.
uint64_t TensorListChecksum(const std::vector<TensorChecksum>& tensors);
// A container's tensors in data-section order (data_offset, then name), and their names.
std::vector<const checkpoint::TensorEntry*> DataOrder(
    const std::vector<checkpoint::TensorEntry>& tensors);
std::vector<std::string> DataOrderNames(const std::vector<checkpoint::TensorEntry>& tensors);

// What one trainer shard published for a step: its file rebuilt as a delta against the
// same shard's file of `base_step`, and/or as an anchor (against nothing).
struct ShardRecord {
  uint64_t step = 0;
  uint64_t base_step = kNoStep;  // kNoStep: no delta
  uint32_t shard = 0, count = 1;
  std::string incarnation = kDefaultIncarnation;  // of the trainer that published it
  // The incarnation whose record of base_step the delta was checked against ("": no
  // delta): a step commits its deltas only onto the base that incarnation committed.
  std::string base_incarnation;
  std::string file;  // the published file's name
  uint64_t file_size = 0;
  ObjectRef delta, anchor;  // at least one present; delta iff base_step != kNoStep
  // The sharded checkpoint's model.safetensors.index.json beside the file, carried to
  // regions verbatim (key, size and xxh3 only; absent: none).
  ObjectRef index;
  uint64_t tensors_xxh3 = 0;  // TensorListChecksum of the file's tensors
  // Names the shard layout (its file and tensor names); layout_sha256 in signed records only.
  uint64_t layout_xxh3 = 0, layout_size = 0;
  std::string layout_sha256;
  // In memory only: the tensor names, in data-section order, where a layout was read
  // (empty otherwise: a full read takes them from the containers).
  std::vector<std::string> names;
  bool named = false;  // `names` are a layout's
  // In memory only: the result checksums a full pull computed, in data-section order.
  std::vector<TensorChecksum> results;
  double published_at = 0;  // Unix time the shard started publishing (informative)
  // In memory only: false when only the layout was read (file and tensor names, no
  // checksums or objects): a partial pull reads no record of a shard it does not need.
  bool loaded = true;
  Signatures signatures;  // as read: the envelope the record was stored in, if signed
};

// A group's shard files and tensor names, in shard order: what changes only when the
// model's layout does, so followers read it once per layout.
struct Layout {
  struct Shard {
    std::string file;
    std::vector<std::string> tensors;
  };
  std::vector<Shard> shards;
  std::string sha256;  // in memory only: of the bytes it was read from, in hex ("": unknown)
};

// Written by the last shard of a group to complete: its records by hash, and what the
// step root needs of them.
struct GroupIndex {
  uint64_t step = 0;
  uint32_t count = 1, group = 0;
  std::string incarnation = kDefaultIncarnation;
  uint64_t base_step = kNoStep;  // of the group's deltas (kNoStep: none has one)
  std::string base_incarnation;  // of their base records ("" iff base_step is kNoStep)
  bool anchors = false;          // every shard has an anchor
  uint64_t chain_bytes = 0;      // per shard its delta, else its anchor
  uint64_t anchor_bytes = 0;     // the anchors' sizes
  double published_at = 0;       // the earliest shard's
  uint64_t layout_xxh3 = 0, layout_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> records;  // [xxh3, size] per shard, in order
  // Signed group indexes only (else empty): the SHA-256 (hex) of the layout and of each record.
  std::string layout_sha256;
  std::vector<std::string> record_sha256;
  Signatures signatures;
};

// A committed step. The root, as stored, names its group indexes; `shards` is filled in
// by LoadShards: every record, or only a selection's (the others from their layouts).
struct StepManifest {
  uint64_t step = 0;
  uint32_t count = 1;
  std::string incarnation = kDefaultIncarnation;  // whose records the step holds
  uint64_t run = 0;              // fixed at the run's first step without a base, inherited after
  uint64_t base_step = kNoStep;  // of every shard that has a delta
  // XXH3 of the base step's root bytes (0: none; a step whose every shard has an anchor may
  // be committed before its base): a region at the base step checks the link without
  // reading the base's root again.
  uint64_t base_root_xxh3 = 0;
  uint64_t anchor_step = 0;  // the nearest step at or before this one on its chain
                             // whose every shard has an anchor
  uint64_t chain_bytes = 0, anchor_bytes = 0;  // summed over the groups
  double published_at = 0;                     // the earliest shard's
  double committed_at = 0;
  struct Group {
    uint64_t xxh3 = 0, size = 0;  // of its group index
    uint64_t layout_xxh3 = 0, layout_size = 0;
    std::string sha256, layout_sha256;  // signed roots only
  };
  std::vector<Group> groups;
  std::vector<ShardRecord> shards;  // empty until LoadShards
  // Signed roots only: the SHA-256 (hex) of the base root's bytes ("" without a base).
  std::string base_root_sha256;
  Signatures signatures;  // the envelope the root was stored in, if signed
  bool anchor() const { return anchor_step == step; }
  // The step's model.safetensors.index.json: the lowest loaded shard's that carries one.
  const ObjectRef* index() const {
    for (const ShardRecord& r : shards) {
      if (r.loaded && r.index.present()) return &r.index;
    }
    return nullptr;
  }
};

// The documents' bytes; with `key`, a signed document: the fields only signed documents
// have (SHA-256 digests) in a DSSE envelope signed by `key`.
std::string RecordJson(const ShardRecord& record, const SigningKey* key = nullptr);
std::string GroupIndexJson(const GroupIndex& group, const SigningKey* key = nullptr);
std::string LayoutJson(const Layout& layout);
// The root's fields; `shards` unused.
std::string RootJson(const StepManifest& root, const SigningKey* key = nullptr);
// The id of the first of `trusted` that signed the document (kUntrusted: unsigned, or by
// no trusted key), naming it `where`.
Status VerifySigned(const Signatures& signatures, const std::vector<PublicKey>& trusted,
                    const std::string& where, std::string* keyid);
std::string LatestJson(uint64_t step);
// `where` names the document in errors (its URL).
Status ParseRecord(const std::vector<uint8_t>& bytes, const std::string& where,
                   ShardRecord* record);
Status ParseGroupIndex(const std::vector<uint8_t>& bytes, const std::string& where,
                       GroupIndex* group);
Status ParseLayout(const std::vector<uint8_t>& bytes, const std::string& where, Layout* layout);
Status ParseRoot(const std::vector<uint8_t>& bytes, const std::string& where, StepManifest* root);
Status ParseLatest(const std::vector<uint8_t>& bytes, const std::string& where, uint64_t* step);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_PROTOCOL_H_

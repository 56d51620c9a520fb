// The commit of a step (src/sync/PUBLISHING.md, "Committing"): claims on who completes a
// group or a step, the group indexes, the step root linked to its base, and the latest
// pointer. Publishers call it after their record is up (CommitFrom); CommitStep is the
// stand-alone entry of sync.h. Racing committers write the same bytes or one root.
#include "src/sync/commit.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/strict_json.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

Status LoadSigner(const std::string& sign_key, const std::vector<std::string>& trust,
                  Signer* signer) {
  if (sign_key.empty()) return Status::Ok();
  signer->key = std::make_unique<SigningKey>();
  ARC_V3_RETURN_IF_ERROR(SigningKey::Load(sign_key, signer->key.get()));
  signer->trusted.push_back(signer->key->public_key());
  for (const std::string& path : trust) {
    std::vector<PublicKey> keys;
    ARC_V3_RETURN_IF_ERROR(PublicKey::LoadAll(path, &keys));
    for (PublicKey& key : keys) signer->trusted.push_back(std::move(key));
  }
  return Status::Ok();
}

std::string FileDifference(const ShardRecord& existing, const ShardRecord& record) {
  if (existing.file != record.file)
    return "the file was '" + existing.file + "', now '" + record.file + "'";
  if (existing.base_step != record.base_step) {
    const auto name = [](uint64_t step) {
      return step == kNoStep ? std::string("none (an anchor alone)")
                             : "step " + std::to_string(step);
    };
    return "the base was " + name(existing.base_step) + ", now " + name(record.base_step);
  }
  if (existing.file_size != record.file_size) {
    return "the file had " + std::to_string(existing.file_size) + " bytes, now " +
           std::to_string(record.file_size);
  }
  if (existing.tensors_xxh3 != record.tensors_xxh3) {
    return "its tensors (names, order or contents) differ: tensors_xxh3 " +
           checkpoint::HexU64(existing.tensors_xxh3) + ", now " +
           checkpoint::HexU64(record.tensors_xxh3);
  }
  if (existing.index.xxh3 != record.index.xxh3 ||
      existing.index.present() != record.index.present()) {
    return "its model.safetensors.index.json differs";
  }
  return "";
}

Status Conflict(Store* store, const ShardRecord& record, const std::string& difference,
                bool committed) {
  return Status(
      ErrorCode::kAlreadyExists,
      "shard " + std::to_string(record.shard) + " of step " + std::to_string(record.step) +
          " was already published with another file (" + difference + "; " + store->url() + "/" +
          (committed
               ? RootKey(record.step)
               : ShardRecordKey(record.step, record.shard, record.count, record.incarnation)) +
          (committed ? "): a committed step never changes"
                     : "): a restarted trainer publishes under a new incarnation, whose records "
                       "supersede this one's until the step is committed"));
}

Status CommittedRecord(Store* store, const StepManifest& root, uint32_t shard,
                       ShardRecord* record) {
  std::vector<bool> want(root.count, false);
  want[shard] = true;
  StepManifest m = root;
  ReadCost cost;
  ARC_V3_RETURN_IF_ERROR(LoadShards(store, &m, &want, nullptr, &cost));
  *record = std::move(m.shards[shard]);
  return Status::Ok();
}

namespace {

// A document a signing completer read must be signed by a trusted key.
Status CheckSigned(const Signer& signer, const Signatures& signatures, const std::string& where) {
  if (signer.get() == nullptr) return Status::Ok();
  std::string keyid;
  const Status s = VerifySigned(signatures, signer.trusted, where, &keyid);
  if (s.ok()) return s;
  return Status(
      s.code(),
      s.message() + ": a signing publisher completes no step from documents it cannot trust");
}

// Moves `latest` forward to `step` (never back). Racing committers of different steps may
// overwrite each other; each checks afterwards and writes again while it sees an older step.
Status AdvanceLatest(Store* store, uint64_t step) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    uint64_t current = 0;
    Status s = ReadLatest(store, &current, nullptr);
    if (s.ok() && current >= step) return Status::Ok();
    if (!s.ok() && s.code() != ErrorCode::kNotFound && s.code() != ErrorCode::kCorruptHeader)
      return s;
    const std::string json = LatestJson(step);
    ARC_V3_RETURN_IF_ERROR(store->Put(kLatestKey, reinterpret_cast<const uint8_t*>(json.data()),
                                      json.size(), PutMode::kOverwrite));
  }
  return Status::Ok();
}

std::string Ranges(const std::vector<uint32_t>& items) {
  std::string text;
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    while (j + 1 < items.size() && items[j + 1] == items[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(items[i]) +
            (j > i ? "-" + std::to_string(items[j]) : "");
    i = j + 1;
  }
  return text;
}
std::string Waiting(const std::vector<uint32_t>& shards, uint32_t count) {
  return "waiting for shard" + std::string(shards.size() > 1 ? "s " : " ") + Ranges(shards) +
         " of " + std::to_string(count);
}

// The documents of a group's records or of a step's group indexes, by position, with the
// XXH3, size and SHA-256 of their bytes.
template <class Doc>
struct Docs {
  std::vector<Doc> docs;
  std::vector<uint64_t> hashes, sizes;
  std::vector<std::string> shas;
};

// Reads every document of `keys` at once: `missing` gets the positions of those not found;
// the first other error (by position) is returned.
template <class Doc, class Parse>
Status GetAll(Store* store, const std::vector<std::string>& keys, const Parse& parse,
              Docs<Doc>* docs, std::vector<uint32_t>* missing) {
  docs->docs.assign(keys.size(), Doc());
  docs->hashes.assign(keys.size(), 0);
  docs->sizes.assign(keys.size(), 0);
  docs->shas.assign(keys.size(), std::string());
  std::vector<Status> statuses(keys.size(), Status::Ok());
  ARC_V3_RETURN_IF_ERROR(
      TryParallelFor(keys.size(), WorkerCount(16, keys.size()), [&](size_t i, size_t) {
        std::vector<uint8_t> bytes;
        Status s = store->Get(keys[i], kMaxDocumentBytes, &bytes, nullptr);
        if (s.ok()) {
          docs->hashes[i] = checkpoint::Hash(bytes.data(), bytes.size());
          docs->sizes[i] = bytes.size();
          docs->shas[i] = DigestHex(Sha256(bytes.data(), bytes.size()));
          s = parse(bytes, store->url() + "/" + keys[i], &docs->docs[i]);
        }
        statuses[i] = s;
      }));
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].code() == ErrorCode::kNotFound) {
      missing->push_back(i);
    } else if (!statuses[i].ok()) {
      return statuses[i];
    }
  }
  return Status::Ok();
}

// The positions of `keys` that a listing of `prefix` lacks.
Status ListMissing(Store* store, const std::string& prefix, const std::vector<std::string>& keys,
                   std::vector<uint32_t>* missing) {
  std::vector<ObjectInfo> listed;
  ARC_V3_RETURN_IF_ERROR(store->List(prefix, &listed));
  std::set<std::string> present;
  for (const ObjectInfo& o : listed) present.insert(o.key);
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (present.count(keys[i]) == 0) missing->push_back(i);
  }
  return Status::Ok();
}

Status Superseded(Store* store, uint64_t step, const std::string& winner, const std::string& inc) {
  return Status(ErrorCode::kAlreadyExists, "step " + std::to_string(step) + " was committed in " +
                                               store->url() + " by incarnation " + winner +
                                               ": the records of incarnation " + inc +
                                               " were superseded (a committed step never changes)");
}

// Of the shards that find a group (or a step) complete at once, one reads and writes its
// index: the first to create the claim `key`; the others leave it to that one unless its
// claim is older than kClaimStale seconds (it died), when they take over. Without claims
// trainers that finish together would each read every record of their group: O(N x 32).
constexpr double kClaimStale = 30;

Status Claim(Store* store, const std::string& key, bool* mine) {
  const std::string json = "{\"claimed_at\": " + std::to_string(UnixSeconds()) + "}\n";
  Status s = store->Put(key, reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                        PutMode::kCreateOnly);
  *mine = s.ok();
  if (s.code() != ErrorCode::kAlreadyExists) return s;
  std::vector<uint8_t> bytes;
  s = store->Get(key, 4096, &bytes, nullptr);
  if (s.code() == ErrorCode::kNotFound)
    return Status::Ok();  // released meanwhile: left to its holder
  if (!s.ok() && s.code() != ErrorCode::kCorruptHeader) return s;  // larger than a claim: stale
  nlohmann::json doc;
  try {
    const char* text = reinterpret_cast<const char*>(bytes.data());
    doc = strict_json::Parse(text, text + bytes.size(), key);
  } catch (...) {  // not one JSON reading: stale, as any damaged claim
  }
  const bool dated = doc.is_object() && doc.contains("claimed_at") && doc["claimed_at"].is_number();
  *mine = !dated || UnixSeconds() - doc["claimed_at"].get<double>() > kClaimStale;
  return Status::Ok();
}

// Whose turn it is to write `key` (a group index or a step root, written once): nobody's
// where it is there already (kDone), another's where it holds `claim` (kOthers).
enum class Turn { kDone, kOthers, kMine };
Status TakeTurn(Store* store, const std::string& key, const std::string& claim, Turn* turn) {
  ObjectInfo info;
  const Status s = store->Head(key, &info);
  *turn = Turn::kDone;
  if (s.ok()) return Status::Ok();
  if (s.code() != ErrorCode::kNotFound) return s;
  bool mine = false;
  ARC_V3_RETURN_IF_ERROR(Claim(store, claim, &mine));
  *turn = mine ? Turn::kMine : Turn::kOthers;
  return Status::Ok();
}

// The index of a group (`index` names it) from its members' records (checked: each record
// is its shard's, of one base, signed under signing).
Status IndexGroup(Store* store, const std::vector<std::string>& keys,
                  const Docs<ShardRecord>& records, const Signer& signer, GroupIndex* index) {
  const uint32_t first = index->group * kFanIn;
  index->anchors = true;
  index->published_at = records.docs[0].published_at;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    const ShardRecord& r = records.docs[i];
    if (r.step != index->step || r.shard != first + i || r.count != index->count ||
        r.incarnation != index->incarnation) {
      return Status(ErrorCode::kCorruptHeader, store->url() + "/" + keys[i] + " is not shard " +
                                                   std::to_string(first + i) + " of step " +
                                                   std::to_string(index->step));
    }
    ARC_V3_RETURN_IF_ERROR(CheckSigned(signer, r.signatures, store->url() + "/" + keys[i]));
    if (r.delta.present()) {
      if (index->base_step != kNoStep &&
          (index->base_step != r.base_step || index->base_incarnation != r.base_incarnation)) {
        return Status(ErrorCode::kInvalidArgument,
                      "the shards of step " + std::to_string(index->step) +
                          " name different bases (step " + std::to_string(index->base_step) +
                          " of incarnation " + index->base_incarnation + ", step " +
                          std::to_string(r.base_step) + " of incarnation " + r.base_incarnation +
                          ")");
      }
      index->base_step = r.base_step;
      index->base_incarnation = r.base_incarnation;
    }
    index->anchors = index->anchors && r.anchor.present();
    index->chain_bytes += r.delta.present() ? r.delta.size : r.anchor.size;
    index->anchor_bytes += r.anchor.present() ? r.anchor.size : 0;
    index->published_at = std::min(index->published_at, r.published_at);
    index->records.emplace_back(records.hashes[i], records.sizes[i]);
    index->record_sha256.push_back(records.shas[i]);
  }
  if (!index->anchors) index->anchor_bytes = 0;
  return Status::Ok();
}

// The group layout: the shard layout each member's record names (a named document of one
// shard, the record's file), in member order.
Status GroupLayout(Store* store, const std::vector<std::string>& keys,
                   const Docs<ShardRecord>& records, const Signer& signer, Layout* layout) {
  std::vector<Layout> shards(keys.size());
  std::vector<Status> statuses(keys.size(), Status::Ok());
  ARC_V3_RETURN_IF_ERROR(
      TryParallelFor(keys.size(), WorkerCount(16, keys.size()), [&](size_t i, size_t) {
        const ShardRecord& r = records.docs[i];
        const std::string key = LayoutKey(r.layout_xxh3), where = store->url() + "/" + key;
        std::vector<uint8_t> bytes;
        Status s = GetNamed(store, key, r.layout_xxh3, r.layout_size, r.layout_sha256,
                            signer.get() != nullptr, &bytes, store->url() + "/" + keys[i]);
        if (s.ok()) s = ParseLayout(bytes, where, &shards[i]);
        if (s.ok() && (shards[i].shards.size() != 1 || shards[i].shards[0].file != r.file)) {
          s = Status(ErrorCode::kCorruptHeader,
                     where + " is not the layout of one shard with " + keys[i] + "'s file");
        }
        statuses[i] = s;
      }));
  for (size_t i = 0; i < keys.size(); ++i) {
    ARC_V3_RETURN_IF_ERROR(statuses[i]);
    layout->shards.push_back(std::move(shards[i].shards[0]));
  }
  return Status::Ok();
}

// Writes a group's layout (named by its XXH3: one already there is this one), then its
// index at `key` (racing completers write the same bytes).
Status WriteGroup(Store* store, const std::string& key, const Layout& layout, const Signer& signer,
                  GroupIndex* index) {
  const std::string layout_json = LayoutJson(layout);
  index->layout_xxh3 = checkpoint::Hash(layout_json.data(), layout_json.size());
  index->layout_size = layout_json.size();
  index->layout_sha256 = DigestHex(Sha256(layout_json));
  Status s = store->Put(LayoutKey(index->layout_xxh3),
                        reinterpret_cast<const uint8_t*>(layout_json.data()), layout_json.size(),
                        PutMode::kCreateOnly);
  if (!s.ok() && s.code() != ErrorCode::kAlreadyExists) return s;
  const std::string json = GroupIndexJson(*index, signer.get());
  s = store->Put(key, reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                 PutMode::kCreateOnly);
  if (!s.ok() && s.code() != ErrorCode::kAlreadyExists) return s;
  return Status::Ok();
}

// Completes group `g` of a step: once every member's record of this incarnation is
// listed, reads them and writes the group's layout and index. Racing completers write
// the same bytes (the index holds nothing but what the records say), should a claim
// go stale under a live completer.
Status CompleteGroup(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                     uint32_t g, bool* done, std::string* pending, const Signer& signer) {
  *done = false;
  const uint32_t first = g * kFanIn, members = std::min(kFanIn, count - g * kFanIn);
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < members; ++i)
    keys.push_back(ShardRecordKey(step, first + i, count, inc));
  const std::string index_key = GroupIndexKey(step, count, inc, g);
  std::vector<uint32_t> missing;
  if (store->listable()) {
    ARC_V3_RETURN_IF_ERROR(
        ListMissing(store, GroupRecordPrefix(step, count, inc, g), keys, &missing));
    Turn turn = Turn::kMine;
    if (missing.empty())
      ARC_V3_RETURN_IF_ERROR(TakeTurn(store, index_key, index_key + ".claim", &turn));
    *done = turn == Turn::kDone;
    if (turn == Turn::kDone) return Status::Ok();
    if (turn == Turn::kOthers) {
      *pending = "another shard of group " + std::to_string(g) + " is completing it";
      return Status::Ok();
    }
  }
  Docs<ShardRecord> records;
  if (missing.empty()) ARC_V3_RETURN_IF_ERROR(GetAll(store, keys, ParseRecord, &records, &missing));
  if (!missing.empty()) {
    for (uint32_t& i : missing) i += first;
    *pending = Waiting(missing, count);
    return Status::Ok();
  }
  GroupIndex index;
  index.step = step;
  index.count = count;
  index.incarnation = inc;
  index.group = g;
  Layout layout;
  ARC_V3_RETURN_IF_ERROR(IndexGroup(store, keys, records, signer, &index));
  ARC_V3_RETURN_IF_ERROR(GroupLayout(store, keys, records, signer, &layout));
  ARC_V3_RETURN_IF_ERROR(WriteGroup(store, index_key, layout, signer, &index));
  *done = true;
  return Status::Ok();
}

// The step is committed by someone else: of this incarnation, or of another that superseded
// it (then the same file for our shard is no conflict, another is).
Status Committed(Store* store, uint64_t step, const std::string& inc, const ShardRecord* ours,
                 CommitResult* result) {
  StepManifest winner;
  ARC_V3_RETURN_IF_ERROR(ReadRoot(store, step, &winner, nullptr));
  if (ours != nullptr && winner.count != ours->count) {
    return Status(ErrorCode::kInvalidArgument,
                  "step " + std::to_string(step) + " was committed with " +
                      std::to_string(winner.count) + " shards, not " + std::to_string(ours->count));
  }
  if (winner.incarnation != inc && ours != nullptr) {
    ShardRecord committed;
    ARC_V3_RETURN_IF_ERROR(CommittedRecord(store, winner, ours->shard, &committed));
    if (!FileDifference(committed, *ours).empty())
      return Superseded(store, step, winner.incarnation, inc);
  }
  result->committed = true;
  return AdvanceLatest(store, step);
}

// A step root in the making: its manifest, and what its group indexes say of its base.
struct Top {
  StepManifest m;
  std::string base_incarnation;
  bool anchors = true;  // every shard has an anchor
};

// The step's manifest (`top->m` names it) from its group indexes (checked: each is its
// group's, of one base, signed under signing).
Status RootOf(Store* store, const std::vector<std::string>& keys, const Docs<GroupIndex>& index,
              const Signer& signer, Top* top) {
  StepManifest& m = top->m;
  m.published_at = index.docs[0].published_at;
  for (uint32_t g = 0; g < keys.size(); ++g) {
    const GroupIndex& gi = index.docs[g];
    if (gi.step != m.step || gi.count != m.count || gi.incarnation != m.incarnation ||
        gi.group != g) {
      return Status(ErrorCode::kCorruptHeader, store->url() + "/" + keys[g] + " is not group " +
                                                   std::to_string(g) + " of step " +
                                                   std::to_string(m.step));
    }
    ARC_V3_RETURN_IF_ERROR(CheckSigned(signer, gi.signatures, store->url() + "/" + keys[g]));
    if (gi.base_step != kNoStep) {
      if (m.base_step != kNoStep &&
          (m.base_step != gi.base_step || top->base_incarnation != gi.base_incarnation)) {
        return Status(ErrorCode::kInvalidArgument,
                      "the shards of step " + std::to_string(m.step) +
                          " name different bases (step " + std::to_string(m.base_step) +
                          " of incarnation " + top->base_incarnation + ", step " +
                          std::to_string(gi.base_step) + " of incarnation " + gi.base_incarnation +
                          ")");
      }
      m.base_step = gi.base_step;
      top->base_incarnation = gi.base_incarnation;
    }
    top->anchors = top->anchors && gi.anchors;
    m.chain_bytes += gi.chain_bytes;
    m.anchor_bytes += gi.anchor_bytes;
    m.published_at = std::min(m.published_at, gi.published_at);
    m.groups.push_back({index.hashes[g], index.sizes[g], gi.layout_xxh3, gi.layout_size,
                        index.shas[g], gi.layout_sha256});
  }
  if (!top->anchors) m.anchor_bytes = 0;
  m.anchor_step = m.step;
  return Status::Ok();
}

Status CommitTop(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                 const ShardRecord* ours, int depth, const Signer& signer, CommitResult* result,
                 bool* wrote);

// Links the step to its base step's root. Its deltas need a committed base (committed
// first here, from its groups, `depth` steps down; else `*pending` says why not); an
// all-anchor step stands alone, linked to its base (and of its run) when that is committed
// already, else starting a run.
Status LinkBase(Store* store, int depth, const Signer& signer, Top* top, std::string* pending) {
  StepManifest& m = top->m;
  StepManifest base;
  std::vector<uint8_t> base_bytes;
  Status s = ReadRoot(store, m.base_step, &base, &base_bytes);
  if (s.code() == ErrorCode::kNotFound && !top->anchors) {
    CommitResult sub;
    bool sub_wrote = false;
    if (depth < 16) {
      ARC_V3_RETURN_IF_ERROR(CommitTop(store, m.base_step, m.count, top->base_incarnation, nullptr,
                                       depth + 1, signer, &sub, &sub_wrote));
    } else {
      sub.pending = "too many uncommitted steps before it";
    }
    if (!sub.committed) {
      *pending =
          "its base step " + std::to_string(m.base_step) + " is not committed: " + sub.pending;
      return Status::Ok();
    }
    s = ReadRoot(store, m.base_step, &base, &base_bytes);
  }
  if (s.code() == ErrorCode::kNotFound) {
    m.base_step = kNoStep;  // an all-anchor step whose base is not committed starts a run
    return Status::Ok();
  }
  ARC_V3_RETURN_IF_ERROR(s);
  if (base.incarnation != top->base_incarnation) {
    // The shards continue another start's base step than the one committed: that start
    // was superseded, and none of its later steps commits (anchors or not).
    return Status(ErrorCode::kChecksumMismatch,
                  "step " + std::to_string(m.step) + "'s shards continue step " +
                      std::to_string(m.base_step) + " of incarnation " + top->base_incarnation +
                      ", but incarnation " + base.incarnation +
                      " committed that step (incarnation " + top->base_incarnation +
                      " was superseded): publish step " + std::to_string(m.step) +
                      " as an anchor to go on from these files");
  }
  if (base.count != m.count) {
    return Status(ErrorCode::kInvalidArgument,
                  "step " + std::to_string(m.step) + " has " + std::to_string(m.count) +
                      " shards, its base step " + std::to_string(m.base_step) + " " +
                      std::to_string(base.count) +
                      " (a new shard count starts with an anchor step)");
  }
  m.base_root_xxh3 = checkpoint::Hash(base_bytes.data(), base_bytes.size());
  m.base_root_sha256 = DigestHex(Sha256(base_bytes.data(), base_bytes.size()));
  m.run = base.run;
  if (!top->anchors) m.anchor_step = base.anchor_step;
  return Status::Ok();
}

// Writes the step's root create-only (`*wrote`: this call's root went in; else another
// committer's did) and advances the latest pointer.
Status WriteRoot(Store* store, const ShardRecord* ours, const Signer& signer, StepManifest* m,
                 CommitResult* result, bool* wrote) {
  const uint64_t step = m->step;
  if (m->run == 0) {
    // A new run: named by the step and the group indexes that started it.
    std::vector<uint64_t> parts = {step};
    for (const auto& g : m->groups) parts.push_back(g.xxh3);
    m->run = checkpoint::CombineHashes(parts);
    if (m->run == 0) m->run = 1;
  }
  // The store must be of this protocol version before a root goes in (a 1.x store is refused).
  uint64_t latest = 0;
  Status s = ReadLatest(store, &latest, nullptr);
  if (!s.ok() && s.code() != ErrorCode::kNotFound && s.code() != ErrorCode::kCorruptHeader)
    return s;
  m->committed_at = UnixSeconds();
  const std::string json = RootJson(*m, signer.get());
  // Our own root must pass the rules every puller checks.
  StepManifest check;
  s = ParseRoot(std::vector<uint8_t>(json.begin(), json.end()), RootKey(step), &check);
  if (!s.ok())
    return Status(ErrorCode::kInvalidArgument,
                  "cannot commit step " + std::to_string(step) + ": " + s.message());
  s = store->Put(RootKey(step), reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                 PutMode::kCreateOnly);
  if (!s.ok() && s.code() != ErrorCode::kAlreadyExists) return s;
  *wrote = s.ok();
  if (!*wrote)
    return Committed(store, step, m->incarnation, ours, result);  // another committer won
  result->committed = true;
  return AdvanceLatest(store, step);
}

// Committing a later step's base: finishes the `missing` groups whose every record is
// there (a completer that died leaves a claim that goes stale); `missing` keeps the others.
Status CompleteGroups(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                      const Signer& signer, std::vector<uint32_t>* missing) {
  std::vector<uint32_t> still;
  for (uint32_t g : *missing) {
    bool done = false;
    std::string why;
    ARC_V3_RETURN_IF_ERROR(CompleteGroup(store, step, count, inc, g, &done, &why, signer));
    if (!done) still.push_back(g);
  }
  *missing = std::move(still);
  return Status::Ok();
}

// What a step waits for: the shards of its `missing` groups.
std::string WaitingGroups(const std::vector<uint32_t>& missing, uint32_t count) {
  std::vector<uint32_t> shards;
  for (uint32_t g : missing) {
    for (uint32_t k = g * kFanIn; k < std::min(count, g * kFanIn + kFanIn); ++k)
      shards.push_back(k);
  }
  return Waiting(shards, count);
}

// Commits `step` of this incarnation once every group index is listed: reads them, links
// the base step's root and writes the step root create-only (racing committers: one root).
Status CommitTop(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                 const ShardRecord* ours, int depth, const Signer& signer, CommitResult* result,
                 bool* wrote) {
  *result = CommitResult();
  *wrote = false;
  // A claim this call took is released when it stops short of the root (its base is not
  // committed yet): the base's committer goes on to this step at once, not 30 s later.
  std::string claimed;
  struct Release {
    Store* store;
    const std::string& key;
    const CommitResult& result;
    ~Release() {
      // Best effort: a claim left behind goes stale and is taken over.
      if (!key.empty() && !result.committed) (void)store->Delete(key);
    }
  } release{store, claimed, *result};
  std::vector<std::string> keys;
  for (uint32_t g = 0; g < GroupCount(count); ++g)
    keys.push_back(GroupIndexKey(step, count, inc, g));
  std::vector<uint32_t> missing;
  if (store->listable()) {
    ARC_V3_RETURN_IF_ERROR(ListMissing(store, GroupIndexPrefix(step, count, inc), keys, &missing));
    if (!missing.empty() && depth > 0) {
      ARC_V3_RETURN_IF_ERROR(CompleteGroups(store, step, count, inc, signer, &missing));
    }
    const std::string claim = GroupIndexPrefix(step, count, inc) + "root.claim";
    Turn turn = Turn::kMine;
    if (missing.empty()) ARC_V3_RETURN_IF_ERROR(TakeTurn(store, RootKey(step), claim, &turn));
    if (turn == Turn::kDone) return Committed(store, step, inc, ours, result);
    if (turn == Turn::kOthers) {
      result->pending = "another shard is committing the step";
      return Status::Ok();
    }
    if (missing.empty()) claimed = claim;
  }
  Docs<GroupIndex> index;
  if (missing.empty())
    ARC_V3_RETURN_IF_ERROR(GetAll(store, keys, ParseGroupIndex, &index, &missing));
  if (!missing.empty()) {
    result->pending = WaitingGroups(missing, count);
    return Status::Ok();
  }
  Top top;
  top.m.step = step;
  top.m.count = count;
  top.m.incarnation = inc;
  ARC_V3_RETURN_IF_ERROR(RootOf(store, keys, index, signer, &top));
  if (top.m.base_step != kNoStep) {
    ARC_V3_RETURN_IF_ERROR(LinkBase(store, depth, signer, &top, &result->pending));
    if (!result->pending.empty()) return Status::Ok();
  }
  return WriteRoot(store, ours, signer, &top.m, result, wrote);
}

}  // namespace

Status CommitFrom(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                  const ShardRecord* ours, const Signer& signer, CommitResult* result) {
  *result = CommitResult();
  if (ours != nullptr) {
    bool done = false;
    Status s = CompleteGroup(store, step, count, inc, GroupOf(ours->shard), &done, &result->pending,
                             signer);
    if (!s.ok() || !done) return s;
  }
  bool wrote = false;
  Status s = CommitTop(store, step, count, inc, ours, 0, signer, result, &wrote);
  if (!s.ok() || !wrote) return s;
  for (uint64_t next = step + 1; next <= kMaxStep && next <= step + 64; ++next) {
    CommitResult later;
    s = CommitTop(store, next, count, inc, nullptr, 0, signer, &later, &wrote);
    if (!s.ok() || !later.committed) break;
  }
  return Status::Ok();
}

Status CommitStep(Store* store, uint64_t step, uint32_t count, const std::string& incarnation,
                  CommitResult* result, const std::string& sign_key) {
  *result = CommitResult();
  Signer signer;
  ARC_V3_RETURN_IF_ERROR(LoadSigner(sign_key, {}, &signer));
  StepManifest root;
  Status s = ReadRoot(store, step, &root, nullptr);
  if (s.ok()) {
    if (root.count != count) {
      return Status(ErrorCode::kInvalidArgument,
                    "step " + std::to_string(step) + " was committed with " +
                        std::to_string(root.count) + " shards, not " + std::to_string(count));
    }
    result->committed = true;
    return AdvanceLatest(store, step);
  }
  if (s.code() != ErrorCode::kNotFound) return s;
  for (uint32_t g = 0; g < GroupCount(count); ++g) {
    bool done = false;
    s = CompleteGroup(store, step, count, incarnation, g, &done, &result->pending, signer);
    if (!s.ok() || !done) return s;
  }
  return CommitFrom(store, step, count, incarnation, nullptr, signer, result);
}

}  // namespace sync
}  // namespace arc_v3

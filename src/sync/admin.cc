// Administering a store (sync.h): listing its committed steps, verifying them (under trust),
// pruning the steps no reader needs, and the small calls around them (a new signing key,
// store settings to StoreOptions). One job: what an operator runs against a store, not a
// region; each part is too small to stand alone.
#include <algorithm>
#include <chrono>
#include <map>

#include "src/common/status_macros.h"
#include "src/sync/route.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

StoreOptions ToStoreOptions(const StoreSettings& settings, bool create) {
  StoreOptions o;
  o.attempts = settings.retries;
  o.connections = settings.connections;
  o.create = create;
  return o;
}

Status GenerateKey(const std::string& path, std::string* key_id) {
  SigningKey key;
  Status s = SigningKey::Generate(&key);
  if (s.ok()) s = key.Write(path);
  if (s.ok()) *key_id = key.id();
  return s;
}

namespace {

// One committed step's documents, as a trusting reader checks them.
Status VerifyStep(Store* store, const Trust& trust, uint64_t step, std::string* keyid) {
  StepManifest m;
  std::vector<uint8_t> bytes;
  ARC_V3_RETURN_IF_ERROR(ReadRoot(store, step, &m, &bytes));
  ARC_V3_RETURN_IF_ERROR(
      VerifySigned(m.signatures, trust.keys, store->url() + "/" + RootKey(step), keyid));
  ReadCost cost;
  ARC_V3_RETURN_IF_ERROR(LoadShards(store, &m, nullptr, nullptr, &cost, /*trusting=*/true));
  for (const ShardRecord& r : m.shards) {
    for (const ObjectRef* ref : {&r.delta, &r.anchor, &r.index}) {
      if (ref->present() &&
          (ref->sha256.empty() ||
           (ref != &r.index && (ref->head_sha256.empty() || ref->sums_sha256.empty())))) {
        return Status(ErrorCode::kUntrusted,
                      store->url() + "/" + ShardRecordKey(step, r.shard, r.count, r.incarnation) +
                          " names " + ref->key + " without its SHA-256");
      }
    }
  }
  // The index file a full pull writes is small: its bytes are checked too.
  if (const ObjectRef* index = m.index()) {
    std::vector<uint8_t> text;
    const Status s = store->Get(index->key, kMaxDocumentBytes, &text, nullptr);
    if (s.code() == ErrorCode::kNotFound) {  // not a pruned step (its root is there): damage
      return Status(ErrorCode::kCorruptChunk,
                    store->url() + "/" + index->key + ", which its record names, is missing");
    }
    ARC_V3_RETURN_IF_ERROR(s);
    if (DigestHex(Sha256(text.data(), text.size())) != index->sha256) {
      return Status(ErrorCode::kUntrusted,
                    store->url() + "/" + index->key +
                        " is not the index its record names (its SHA-256 differs)");
    }
  }
  if (m.base_step != kNoStep) {
    StepManifest base;
    std::vector<uint8_t> base_bytes;
    const Status s = ReadRoot(store, m.base_step, &base, &base_bytes);
    if (s.ok() && DigestHex(Sha256(base_bytes.data(), base_bytes.size())) != m.base_root_sha256) {
      return Status(ErrorCode::kUntrusted,
                    store->url() + "/" + RootKey(step) + " names another root of step " +
                        std::to_string(m.base_step) + " than the store holds");
    }
    if (!s.ok() && s.code() != ErrorCode::kNotFound) return s;  // a pruned base: nothing to link
  }
  return Status::Ok();
}

}  // namespace

Status VerifySteps(Store* store, const std::vector<std::string>& trust_files,
                   std::vector<StepVerdict>* verdicts) {
  verdicts->clear();
  Trust trust;
  ARC_V3_RETURN_IF_ERROR(LoadTrust(trust_files, &trust));
  if (!trust.on())
    return Status(ErrorCode::kInvalidArgument, "verifying needs at least one trusted public key");
  std::vector<ObjectInfo> roots;
  ARC_V3_RETURN_IF_ERROR(store->List("steps/", &roots));
  for (const ObjectInfo& o : roots) {
    const uint64_t step = StepOfKey(o.key);
    if (step == kNoStep || o.key != RootKey(step)) continue;
    StepVerdict v;
    v.step = step;
    v.status = UnderTrust(trust, VerifyStep(store, trust, step, &v.keyid));
    if (v.status.code() == ErrorCode::kNotFound) continue;  // pruned meanwhile
    verdicts->push_back(std::move(v));
  }
  std::sort(verdicts->begin(), verdicts->end(),
            [](const StepVerdict& a, const StepVerdict& b) { return a.step < b.step; });
  return Status::Ok();
}

Status ListSteps(Store* store, std::vector<StepListing>* steps, bool load_records) {
  steps->clear();
  std::map<uint64_t, StepListing> by_step;
  // Roots, group indexes, records and objects (layouts are shared by steps: not listed).
  for (const char* prefix : {"steps/", "groups/", "r/", "o/"}) {
    std::vector<ObjectInfo> objects;
    ARC_V3_RETURN_IF_ERROR(store->List(prefix, &objects));
    for (ObjectInfo& o : objects) {
      const uint64_t step = StepOfKey(o.key);
      if (step == kNoStep) continue;
      StepListing& l = by_step[step];
      l.step = step;
      l.bytes += o.size;
      l.committed = l.committed || o.key == RootKey(step);
      l.objects.push_back(std::move(o));
    }
  }
  for (auto& entry : by_step) {
    StepListing& l = entry.second;
    if (l.committed) {
      Status s = load_records ? ReadManifest(store, l.step, &l.manifest, nullptr)
                              : ReadRoot(store, l.step, &l.manifest, nullptr);
      if (s.code() == ErrorCode::kNotFound) {
        l.committed = false;  // pruned meanwhile
      } else if (!s.ok()) {
        return s;
      }
    }
    steps->push_back(std::move(l));
  }
  return Status::Ok();
}

Status Prune(Store* store, uint32_t keep_anchors, bool dry_run, PruneResult* report,
             double min_age_seconds) {
  *report = PruneResult();
  if (keep_anchors == 0)
    return Status(ErrorCode::kInvalidArgument, "pruning must keep at least one anchor");
  std::vector<StepListing> steps;
  ARC_V3_RETURN_IF_ERROR(ListSteps(store, &steps, false));
  std::vector<uint64_t> anchors;  // committed anchor steps, newest first
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->committed && it->manifest.anchor()) anchors.push_back(it->step);
  }
  // The anchor before the newest one stays: a puller that started from it before the
  // newest was committed may still be walking its chain.
  const size_t keep = std::max<size_t>(keep_anchors, 2);
  if (anchors.size() < keep) return Status::Ok();
  report->keep_from = anchors[keep - 1];
  // A kept step whose chain starts at an older anchor (a base named with --base-step)
  // keeps that chain.
  for (const StepListing& l : steps) {
    if (l.committed && l.step >= report->keep_from)
      report->keep_from = std::min(report->keep_from, l.manifest.anchor_step);
  }
  // A step committed within min_age keeps its anchor's chain: a region may be walking it.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const StepListing& l : steps) {
    if (l.committed && now - l.manifest.committed_at < min_age_seconds) {
      report->keep_from = std::min(report->keep_from, l.manifest.anchor_step);
    }
  }
  std::vector<const StepListing*> doomed;
  for (const StepListing& l : steps) {
    if (l.step < report->keep_from) doomed.push_back(&l);
  }
  for (const StepListing* l : doomed) {
    report->deleted_steps.push_back(l->step);
    report->deleted_objects += l->objects.size();
    report->deleted_bytes += l->bytes;
  }
  if (dry_run) return Status::Ok();
  // Roots first: a step disappears before any of its pieces do.
  for (const StepListing* l : doomed) {
    if (!l->committed) continue;
    ARC_V3_RETURN_IF_ERROR(store->Delete(RootKey(l->step)));
  }
  for (const StepListing* l : doomed) {
    for (const ObjectInfo& o : l->objects) {
      if (o.key == RootKey(l->step)) continue;
      ARC_V3_RETURN_IF_ERROR(store->Delete(o.key));
    }
  }
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3

// Reading a committed step from a store (src/sync/PROTOCOL.md, "Reading a step"): the
// latest pointer, a step's root, its group indexes, layouts and shard records, each
// document checked against the hashes that name it and parsed by protocol.h. Every read
// is counted in a ReadCost.
#include "src/sync/step_reader.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "src/checkpoint/container.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {

// Trusting, the XXH3 is never the only check.
Status GetNamed(Store* store, const std::string& key, uint64_t xxh3, uint64_t size,
                const std::string& sha256, bool trusting, std::vector<uint8_t>* bytes,
                const std::string& named_by) {
  if (trusting && sha256.empty()) {
    return Status(ErrorCode::kUntrusted,
                  store->url() + "/" + key + " is named by " + named_by +
                      " without a SHA-256 (an unsigned document under a signed one)");
  }
  Status s = store->Get(key, std::min(size, kMaxDocumentBytes), bytes, nullptr);
  // Longer than named (the store refuses to read past `size`): not the object named.
  if (s.code() == ErrorCode::kCorruptHeader) s = Status(ErrorCode::kCorruptChunk, s.message());
  if (!s.ok()) return Status(s.code(), s.message() + " (named by " + named_by + ")");
  const bool sha_differs =
      !sha256.empty() && DigestHex(Sha256(bytes->data(), bytes->size())) != sha256;
  if (sha_differs && trusting) {
    return Status(ErrorCode::kUntrusted, store->url() + "/" + key + " is not the object " +
                                             named_by + " names (its SHA-256 differs)");
  }
  if (bytes->size() != size || checkpoint::Hash(bytes->data(), bytes->size()) != xxh3) {
    return Status(ErrorCode::kCorruptChunk,
                  store->url() + "/" + key + " is not the object " + named_by + " names (" +
                      std::to_string(bytes->size()) + " bytes, XXH3 " +
                      checkpoint::HexU64(checkpoint::Hash(bytes->data(), bytes->size())) +
                      "; named: " + std::to_string(size) + " bytes, " + checkpoint::HexU64(xxh3) +
                      ")");
  }
  if (sha_differs) {
    return Status(ErrorCode::kUntrusted, store->url() + "/" + key + " is not the object " +
                                             named_by + " names (its SHA-256 differs)");
  }
  return Status::Ok();
}

Status ReadRoot(Store* store, uint64_t step, StepManifest* root, std::vector<uint8_t>* bytes) {
  std::vector<uint8_t> data;
  const std::string key = RootKey(step);
  Status s = store->Get(key, kMaxDocumentBytes, &data, nullptr);
  if (!s.ok()) {
    if (s.code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound, "step " + std::to_string(step) + " is not committed in " +
                                              store->url() + " (no " + key + ")");
    }
    return s;
  }
  ARC_V3_RETURN_IF_ERROR(ParseRoot(data, store->url() + "/" + key, root));
  if (root->step != step) {
    return Status(ErrorCode::kCorruptHeader,
                  store->url() + "/" + key + " describes step " + std::to_string(root->step));
  }
  if (bytes != nullptr) *bytes = std::move(data);
  return Status::Ok();
}

namespace {

// The reads of one LoadShards, in parallel rounds: every read is counted in `cost`, and a
// round's first error (in time) ends the load.
class ShardLoader {
 public:
  ShardLoader(Store* store, StepManifest* m, ReadCost* cost, bool trusting)
      : store_(store),
        m_(m),
        cost_(cost),
        trusting_(trusting),
        root_url_(store->url() + "/" + RootKey(m->step)) {}

  // The layouts of the groups that `layouts` lacks (kept there), then each shard's file and
  // tensor names from its group's layout.
  Status ReadLayouts(LayoutCache* layouts) {
    const uint32_t groups = GroupCount(m_->count);
    std::vector<uint32_t> missing;
    for (uint32_t g = 0; g < groups; ++g) {
      // Under trust a cached layout counts only with the SHA-256 this root names for it.
      const auto cached = layouts->find(m_->groups[g].layout_xxh3);
      if (cached == layouts->end() ||
          (trusting_ && cached->second.sha256 != m_->groups[g].layout_sha256)) {
        missing.push_back(g);
      }
    }
    std::vector<Layout> read(missing.size());
    ARC_V3_RETURN_IF_ERROR(Round(missing.size(), [&](size_t i) {
      const StepManifest::Group& g = m_->groups[missing[i]];
      const std::string key = LayoutKey(g.layout_xxh3);
      std::vector<uint8_t> bytes;
      Status s = Get(key, g.layout_xxh3, g.layout_size, g.layout_sha256, root_url_, &bytes);
      if (s.ok()) s = ParseLayout(bytes, store_->url() + "/" + key, &read[i]);
      if (s.ok()) read[i].sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));
      return s;
    }));
    for (size_t i = 0; i < missing.size(); ++i)
      (*layouts)[m_->groups[missing[i]].layout_xxh3] = std::move(read[i]);
    for (uint32_t g = 0; g < groups; ++g) {
      const Layout& layout = layouts->at(m_->groups[g].layout_xxh3);
      const uint32_t members = std::min(kFanIn, m_->count - g * kFanIn);
      if (layout.shards.size() != members) {
        return Status(ErrorCode::kCorruptHeader,
                      store_->url() + "/" + LayoutKey(m_->groups[g].layout_xxh3) + " lists " +
                          std::to_string(layout.shards.size()) + " shards, not group " +
                          std::to_string(g) + "'s " + std::to_string(members));
      }
      for (uint32_t i = 0; i < members; ++i) {
        ShardRecord& r = m_->shards[g * kFanIn + i];
        r.step = m_->step;
        r.shard = g * kFanIn + i;
        r.count = m_->count;
        r.incarnation = m_->incarnation;
        r.file = layout.shards[i].file;
        r.names = layout.shards[i].tensors;
        r.named = true;
        r.loaded = false;
      }
    }
    return Status::Ok();
  }

  // The indexes of the groups `need_group` marks, checked against the root.
  Status ReadIndexes(const std::vector<bool>& need_group, std::vector<GroupIndex>* index) {
    std::vector<uint32_t> read_groups;
    for (uint32_t g = 0; g < need_group.size(); ++g) {
      if (need_group[g]) read_groups.push_back(g);
    }
    return Round(read_groups.size(), [&](size_t i) {
      const uint32_t g = read_groups[i];
      const std::string key = GroupIndexKey(m_->step, m_->count, m_->incarnation, g);
      const StepManifest::Group& named = m_->groups[g];
      std::vector<uint8_t> bytes;
      Status s = Get(key, named.xxh3, named.size, named.sha256, root_url_, &bytes);
      if (s.ok()) s = ParseGroupIndex(bytes, store_->url() + "/" + key, &(*index)[g]);
      if (s.ok()) s = CheckIndex(g, (*index)[g], store_->url() + "/" + key);
      return s;
    });
  }

  // The records of `shards`, checked against their group indexes (and layouts).
  Status ReadRecords(const std::vector<uint32_t>& shards, const std::vector<GroupIndex>& index) {
    return Round(shards.size(), [&](size_t i) {
      const uint32_t k = shards[i];
      const GroupIndex& group = index[GroupOf(k)];
      const auto named = group.records[k % kFanIn];
      const std::string key = ShardRecordKey(m_->step, k, m_->count, m_->incarnation);
      const std::string where = store_->url() + "/" + key;
      std::vector<uint8_t> bytes;
      Status s =
          Get(key, named.first, named.second,
              group.record_sha256.empty() ? std::string() : group.record_sha256[k % kFanIn],
              store_->url() + "/" + GroupIndexKey(m_->step, m_->count, m_->incarnation, GroupOf(k)),
              &bytes);
      ShardRecord r;
      if (s.ok()) s = ParseRecord(bytes, where, &r);
      if (s.ok()) s = CheckRecord(k, r, group, where);
      if (s.ok()) {
        r.names = std::move(m_->shards[k].names);  // the layout's, where it was read
        r.named = m_->shards[k].named;
        m_->shards[k] = std::move(r);
      }
      return s;
    });
  }

  const std::string& root_url() const { return root_url_; }

 private:
  // Runs read(i) for every i < n, 16 at a time: the first error one gives, or one throws.
  template <class Read>
  Status Round(size_t n, const Read& read) {
    Status first;
    const Status thrown = TryParallelFor(n, WorkerCount(16, n), [&](size_t i, size_t) {
      const Status s = read(i);
      std::lock_guard<std::mutex> lock(mutex_);
      if (!s.ok() && first.ok()) first = s;
    });
    return thrown.ok() ? first : thrown;
  }

  // GetNamed, counted.
  Status Get(const std::string& key, uint64_t xxh3, uint64_t size, const std::string& sha256,
             const std::string& named_by, std::vector<uint8_t>* bytes) {
    const Status s = GetNamed(store_, key, xxh3, size, sha256, trusting_, bytes, named_by);
    std::lock_guard<std::mutex> lock(mutex_);
    cost_->requests += 1;
    cost_->bytes += bytes->size();
    return s;
  }

  Status CheckIndex(uint32_t g, const GroupIndex& gi, const std::string& where) const {
    const StepManifest& m = *m_;
    if (gi.step != m.step || gi.count != m.count || gi.incarnation != m.incarnation ||
        gi.group != g) {
      return Status(ErrorCode::kCorruptHeader,
                    where + " is not group " + std::to_string(g) + " of this step");
    }
    if (gi.layout_xxh3 != m.groups[g].layout_xxh3 || gi.layout_size != m.groups[g].layout_size ||
        (!m.groups[g].layout_sha256.empty() && gi.layout_sha256 != m.groups[g].layout_sha256)) {
      return Status(ErrorCode::kCorruptHeader, where + " names another layout than its root");
    }
    // A base the root names binds every group with deltas, anchor steps' too: a chain
    // route applies their deltas.
    if (gi.base_step != kNoStep && (m.base_step != kNoStep || !gi.anchors) &&
        gi.base_step != m.base_step) {
      return Status(ErrorCode::kCorruptHeader, where + ".base_step differs from the step's");
    }
    if (m.anchor() && !gi.anchors) {
      return Status(ErrorCode::kCorruptHeader,
                    where + ": not every shard has an anchor in an anchor step");
    }
    return Status::Ok();
  }

  Status CheckRecord(uint32_t k, const ShardRecord& r, const GroupIndex& group,
                     const std::string& where) const {
    const StepManifest& m = *m_;
    if (r.step != m.step || r.shard != k || r.count != m.count || r.incarnation != m.incarnation) {
      return Status(ErrorCode::kCorruptHeader,
                    where + " is not shard " + std::to_string(k) + " of this step");
    }
    if (r.delta.present() && (m.base_step != kNoStep || !m.anchor()) &&
        (r.base_step != m.base_step || r.base_incarnation != group.base_incarnation)) {
      return Status(ErrorCode::kCorruptHeader,
                    where + ".base_step or base_incarnation differs from its group's");
    }
    if (!r.anchor.present() && m.anchor()) {
      return Status(ErrorCode::kCorruptHeader, where + " has no anchor in an anchor step");
    }
    if (!m.shards[k].loaded &&
        r.file != m.shards[k].file) {  // read with its layout: they must agree
      return Status(ErrorCode::kCorruptHeader, where + " is not the file its layout names");
    }
    return Status::Ok();
  }

  Store* store_;
  StepManifest* m_;
  ReadCost* cost_;
  const bool trusting_;
  const std::string root_url_;
  std::mutex mutex_;
};

// The root's sizes and anchors must be its groups'.
Status CheckGroupSums(const StepManifest& m, const std::vector<GroupIndex>& index,
                      const std::string& root_url) {
  uint64_t chain = 0, anchor = 0;
  bool anchors = true;
  for (const GroupIndex& g : index) {
    chain += g.chain_bytes;
    anchor += g.anchor_bytes;
    anchors = anchors && g.anchors;
  }
  if (chain != m.chain_bytes || (anchors ? anchor : 0) != m.anchor_bytes || anchors != m.anchor()) {
    return Status(ErrorCode::kCorruptHeader,
                  root_url + ": its sizes or anchors are not its groups'");
  }
  return Status::Ok();
}

}  // namespace

Status LoadShards(Store* store, StepManifest* m, const std::vector<bool>* want,
                  LayoutCache* layouts, ReadCost* cost, bool trusting) {
  const uint32_t groups = GroupCount(m->count);
  const auto wanted = [&](uint32_t k) {
    return want == nullptr || (k < want->size() && (*want)[k]);
  };
  std::vector<bool> need_group(groups, false);
  for (uint32_t k = 0; k < m->count; ++k)
    need_group[GroupOf(k)] = need_group[GroupOf(k)] || wanted(k);
  ShardLoader loader(store, m, cost, trusting);
  m->shards.assign(m->count, ShardRecord());
  // Layouts (partial loads with a cache only): the file and tensor names of every shard.
  if (want != nullptr && layouts != nullptr) ARC_V3_RETURN_IF_ERROR(loader.ReadLayouts(layouts));
  // Group indexes, then the records they name.
  std::vector<GroupIndex> index(groups);
  ARC_V3_RETURN_IF_ERROR(loader.ReadIndexes(need_group, &index));
  if (want == nullptr) ARC_V3_RETURN_IF_ERROR(CheckGroupSums(*m, index, loader.root_url()));
  std::vector<uint32_t> read_shards;
  for (uint32_t k = 0; k < m->count; ++k) {
    if (wanted(k)) read_shards.push_back(k);
  }
  ARC_V3_RETURN_IF_ERROR(loader.ReadRecords(read_shards, index));
  std::set<std::string> files;
  for (const ShardRecord& r : m->shards) {
    if (!r.file.empty() && !files.insert(r.file).second) {
      return Status(ErrorCode::kCorruptHeader,
                    loader.root_url() + ": two shards publish '" + r.file + "'");
    }
  }
  return Status::Ok();
}

Status ReadManifest(Store* store, uint64_t step, StepManifest* manifest,
                    std::vector<uint8_t>* bytes) {
  ARC_V3_RETURN_IF_ERROR(ReadRoot(store, step, manifest, bytes));
  ReadCost cost;
  return LoadShards(store, manifest, nullptr, nullptr, &cost);
}

Status ReadLatest(Store* store, uint64_t* step, std::string* etag) {
  std::vector<uint8_t> data;
  ObjectInfo info;
  Status s = store->Get(kLatestKey, kMaxDocumentBytes, &data, &info);
  if (!s.ok()) {
    if (s.code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound,
                    store->url() + " has no committed step yet (" + s.message() + ")");
    }
    return s;
  }
  if (etag != nullptr) *etag = info.etag;
  return ParseLatest(data, store->url() + "/" + kLatestKey, step);
}

uint64_t ProbeLater(Store* store, uint64_t from, int probes) {
  for (int i = 0; i < probes && from < kMaxStep; ++i) {
    ObjectInfo info;
    if (!store->Head(RootKey(from + 1), &info).ok()) break;
    ++from;
  }
  return from;
}

}  // namespace sync
}  // namespace arc_v3

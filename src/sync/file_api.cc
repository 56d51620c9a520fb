// The file-level sync calls of arc_v3_sync.hpp (PublishFile, PullFiles, FollowFiles,
// MirrorSteps, FollowMirror, ListSteps, VerifySteps, PruneSteps): stores opened by URL,
// public options turned into the sync layer's own (sync.h).
#include <memory>
#include <string>
#include <vector>

#include "arc_v3_sync.hpp"
#include "src/common/status_macros.h"
#include "src/sync/store.h"
#include "src/sync/sync.h"

namespace arc_v3 {

namespace {

Status Open(const std::string& url, const StoreSettings& settings, bool create, std::unique_ptr<sync::Store>* store) {
  return sync::OpenStore(url, sync::ToStoreOptions(settings, create), store);
}

StoredObject Stored(const sync::ObjectRef& ref) {
  StoredObject o;
  if (ref.present()) {
    o.key = ref.key;
    o.bytes = ref.size;
  }
  return o;
}

sync::PullOptions ToPullOptions(const PullFilesOptions& options) {
  sync::PullOptions o;
  o.step = options.step == kLatestStep ? kNoStep : options.step;  // kNoStep: the latest
  o.tensors = options.tensors;
  o.row_begin = options.row_begin;
  o.row_end = options.row_end;
  o.reset = options.reset;
  o.force = options.force;
  o.trust = options.trusted_keys;
  o.run = checkpoint::RunOptions(options.checkpoint);
  o.store = sync::ToStoreOptions(options.store);
  return o;
}

StepInfo ToStepInfo(const sync::StepListing& l) {
  StepInfo info;
  info.step = l.step;
  info.committed = l.committed;
  info.objects = l.objects.size();
  info.bytes = l.bytes;
  if (!l.committed) return info;
  const sync::StepManifest& m = l.manifest;
  info.base_step = m.base_step;
  info.anchor_step = m.anchor_step;
  info.anchor = m.anchor();
  info.count = m.count;
  info.incarnation = m.incarnation;
  info.run = m.run;
  info.published_at = m.published_at;
  info.committed_at = m.committed_at;
  if (m.shards.empty()) {  // the root alone: its sums
    info.delta_bytes = m.chain_bytes;
    info.anchor_bytes = m.anchor_bytes;
  }
  for (const sync::ShardRecord& r : m.shards) {
    info.delta_bytes += r.delta.size;
    info.anchor_bytes += r.anchor.size;
    StepShardInfo shard;
    shard.shard = r.shard;
    shard.file = r.file;
    shard.file_bytes = r.file_size;
    shard.delta_bytes = r.delta.present() ? r.delta.size : 0;
    shard.anchor_bytes = r.anchor.present() ? r.anchor.size : 0;
    info.shards.push_back(std::move(shard));
  }
  return info;
}

}  // namespace

Status PublishFile(const std::string& store_url, const PublishFileOptions& options, PublishFileResult* report) {
  *report = PublishFileResult();
  // The keys first: a publish that cannot sign leaves no new store directory behind.
  ARC_V3_RETURN_IF_ERROR(sync::CheckPublishKeys(options.sign_key, options.trusted_keys));
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, options.store, true, &store));
  sync::PublishOptions o;
  o.step = options.step;
  o.next = options.next;
  o.prev = options.prev;
  o.base_step = options.base_step;
  o.shard = options.shard;
  o.count = options.count;
  o.incarnation = options.incarnation.empty() ? sync::DefaultIncarnation() : options.incarnation;
  o.anchor_every = options.anchor_every;
  o.index = options.index;
  o.no_index = options.no_index;
  o.work_dir = options.work_dir;
  o.run = checkpoint::RunOptions(options.checkpoint);
  o.sign_key = options.sign_key;
  o.trust = options.trusted_keys;
  sync::PublishReport r;
  ARC_V3_RETURN_IF_ERROR(sync::Publish(store.get(), o, &r));
  report->step = r.record.step;
  report->shard = r.record.shard;
  report->count = r.record.count;
  report->file = r.record.file;
  report->file_bytes = r.record.file_size;
  report->delta = Stored(r.record.delta);
  report->anchor = Stored(r.record.anchor);
  report->index = Stored(r.record.index);
  report->committed = r.committed;
  report->pending = r.pending;
  report->already_published = r.already_published;
  report->note = r.note;
  report->uploaded_bytes = r.uploaded_bytes;
  report->uploaded_objects = r.uploaded_objects;
  report->encode_seconds = r.encode_seconds;
  report->hash_seconds = r.hash_seconds;
  report->upload_seconds = r.upload_seconds;
  report->commit_seconds = r.commit_seconds;
  report->total_seconds = r.total_seconds;
  return Status::Ok();
}

Status PullFiles(const std::string& store_url, const std::string& dir, const PullFilesOptions& options,
                 PullFilesResult* report) {
  *report = PullFilesResult();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, options.store, false, &store));
  return sync::Pull(store.get(), dir, ToPullOptions(options), report);
}

Status FollowFiles(const std::string& store_url, const std::string& dir, const PullFilesOptions& options,
                   const FollowOptions& follow,
                   const std::function<bool(const FollowEvent& event, const PullFilesResult* pulled)>& on_event) {
  return sync::Follow(store_url, dir, ToPullOptions(options), follow, on_event);
}

Status MirrorSteps(const std::string& src_url, const std::string& dst_url,
                   const MirrorOptions& options, MirrorResult* report) {
  *report = MirrorResult();
  std::unique_ptr<sync::Store> src, dst;
  ARC_V3_RETURN_IF_ERROR(Open(src_url, options.store, false, &src));
  ARC_V3_RETURN_IF_ERROR(Open(dst_url, options.store, true, &dst));
  return sync::Mirror(src.get(), dst.get(), options, /*anchor_route=*/false, report);
}

Status FollowMirror(const std::string& src_url, const std::string& dst_url,
                    const MirrorOptions& options, const FollowOptions& follow,
                    const std::function<bool(const FollowEvent& event,
                                             const MirrorResult* mirrored)>& on_event) {
  return sync::FollowMirror(src_url, dst_url, options, follow, on_event);
}

Status ListSteps(const std::string& store_url, const StoreSettings& settings, bool shards,
                 std::vector<StepInfo>* steps) {
  steps->clear();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, settings, false, &store));
  std::vector<sync::StepListing> listing;
  ARC_V3_RETURN_IF_ERROR(sync::ListSteps(store.get(), &listing, shards));
  for (const sync::StepListing& l : listing) steps->push_back(ToStepInfo(l));
  return Status::Ok();
}

Status VerifySteps(const std::string& store_url, const StoreSettings& settings,
                   const std::vector<std::string>& trusted_keys, std::vector<StepVerdict>* verdicts) {
  verdicts->clear();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, settings, false, &store));
  return sync::VerifySteps(store.get(), trusted_keys, verdicts);
}

Status PruneSteps(const std::string& store_url, const StoreSettings& settings, uint32_t keep_anchors,
                  bool dry_run, double min_age_seconds, PruneResult* report) {
  *report = PruneResult();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, settings, false, &store));
  return sync::Prune(store.get(), keep_anchors, dry_run, report, min_age_seconds);
}

}  // namespace arc_v3

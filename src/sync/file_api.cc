// The file-level sync calls of arc_v3_sync.hpp (PublishFile, PullFiles, FollowFiles,
// MirrorSteps, FollowMirror, ListSteps, VerifySteps, PruneSteps): stores opened by URL,
// the public options are the sync layer's own (sync.h) less its test hooks.
#include <memory>
#include <string>
#include <vector>

#include "arc_v3_sync.hpp"
#include "src/common/status_macros.h"
#include "src/sync/store.h"
#include "src/sync/sync.h"

namespace arc_v3 {

namespace {

Status Open(const std::string& url, const StoreSettings& settings, bool create,
            std::unique_ptr<sync::Store>* store) {
  return sync::OpenStore(url, sync::ToStoreOptions(settings, create), store);
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

Status PublishFile(const std::string& store_url, const PublishFileOptions& options,
                   PublishFileResult* result) {
  *result = PublishFileResult();
  // The keys first: a publish that cannot sign leaves no new store directory behind.
  ARC_V3_RETURN_IF_ERROR(sync::CheckPublishKeys(options.sign_key, options.trusted_keys));
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, options.store, true, &store));
  sync::PublishReport r;
  ARC_V3_RETURN_IF_ERROR(sync::Publish(store.get(), sync::PublishOptions(options), &r));
  *result = r;  // the public part
  return Status::Ok();
}

Status PullFiles(const std::string& store_url, const std::string& dir,
                 const PullFilesOptions& options, PullFilesResult* result) {
  *result = PullFilesResult();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, options.store, false, &store));
  return sync::Pull(store.get(), dir, sync::PullOptions(options), result);
}

Status FollowFiles(
    const std::string& store_url, const std::string& dir, const PullFilesOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const PullFilesResult* pulled)>& on_event) {
  return sync::Follow(store_url, dir, sync::PullOptions(options), follow, on_event);
}

Status MirrorSteps(const std::string& src_url, const std::string& dst_url,
                   const MirrorOptions& options, MirrorResult* result) {
  *result = MirrorResult();
  std::unique_ptr<sync::Store> src, dst;
  ARC_V3_RETURN_IF_ERROR(Open(src_url, options.store, false, &src));
  ARC_V3_RETURN_IF_ERROR(Open(dst_url, options.store, true, &dst));
  return sync::Mirror(src.get(), dst.get(), options, /*anchor_route=*/false, result);
}

Status FollowMirror(
    const std::string& src_url, const std::string& dst_url, const MirrorOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const MirrorResult* mirrored)>& on_event) {
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
                   const std::vector<std::string>& trusted_keys,
                   std::vector<StepVerdict>* verdicts) {
  verdicts->clear();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, settings, false, &store));
  return sync::VerifySteps(store.get(), trusted_keys, verdicts);
}

Status PruneSteps(const std::string& store_url, const StoreSettings& settings,
                  uint32_t keep_anchors, bool dry_run, double min_age_seconds,
                  PruneResult* result) {
  *result = PruneResult();
  std::unique_ptr<sync::Store> store;
  ARC_V3_RETURN_IF_ERROR(Open(store_url, settings, false, &store));
  return sync::Prune(store.get(), keep_anchors, dry_run, result, min_age_seconds);
}

}  // namespace arc_v3

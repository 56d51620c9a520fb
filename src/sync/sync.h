// Cross-region sync through an object store (src/sync/PROTOCOL.md).
//
// Each trainer shard publishes its safetensors file for a step (Publish): a delta against
// its file of the base step, an anchor (the file whole, compressed) every N steps, and a
// record of what it uploaded. Shards complete a step in groups of 32: the last of a
// group writes the group's index, the last group the step's write-once root, then the
// `latest` pointer (no coordinator; O(N) requests). Each region pulls a step into a
// directory (Pull) by the cheapest verified path, and records the step only after a
// verified apply. The trainer never talks to the fleet.
#ifndef ARC_V3_SRC_SYNC_SYNC_H_
#define ARC_V3_SRC_SYNC_SYNC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "arc_v3_sync.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/sync/protocol.h"
#include "src/sync/step_reader.h"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

// The documents' "no step" (protocol.h) is the public one; kLatestStep is no step number.
static_assert(kNoStep == ::arc_v3::kNoStep && ::arc_v3::kLatestStep > kMaxStep, "step sentinels");

// The incarnation a publisher names when not told: $ARC_V3_INCARNATION, else
// "restart-" + $TORCHELASTIC_RESTART_COUNT (torchrun), else "0".
std::string DefaultIncarnation();

// What Publish takes: the public PublishFileOptions (arc_v3_sync.hpp). Its `incarnation`
// is 1 to 64 of [A-Za-z0-9._-] (a trainer restarted mid-step publishes under a new one,
// whose records supersede the old ones' until the step is committed): "0" by default,
// DefaultIncarnation() where a public caller left it empty. Its `store` is not read (the
// store is open), nor the checkpoint options that do not apply to publishing.
struct PublishOptions : PublishFileOptions {
  PublishOptions() { incarnation = kDefaultIncarnation; }
  explicit PublishOptions(const PublishFileOptions& options) : PublishFileOptions(options) {
    if (incarnation.empty()) incarnation = DefaultIncarnation();
  }
};

// What Publish says: the public PublishFileResult (arc_v3_sync.hpp), and the record it
// describes (with already_published: the first publish's).
struct PublishReport : PublishFileResult {
  ShardRecord record;
};

// Publishes one shard's file for a step and commits the step if it is complete.
// Refuses (kChecksumMismatch) a `prev` whose tensors are not what this shard published
// for the base step, and (kNotFound) a base step this shard never published. Publishing
// the same file (name, base step, tensors) again is a no-op that keeps the first
// publish's objects, whatever the anchor, effort or format asked for now; another file
// for a published shard is kAlreadyExists, naming what differs.
Status Publish(Store* store, const PublishOptions& options, PublishReport* report);
// Loads a publisher's signing key and trusted keys as Publish would (kInvalidArgument
// naming a file that is not one): for a caller that checks them before opening (and so
// creating) a store.
Status CheckPublishKeys(const std::string& sign_key, const std::vector<std::string>& trusted_keys);
// The same from opened checkpoints (options.next and options.prev unused): `prev` empty
// for an anchor alone, `next` one file (e.g. Checkpoint::FromMemory of a trainer rank's
// tensors). `in_memory`: containers stay in memory instead of options.work_dir.
Status PublishCheckpoints(Store* store, const PublishOptions& options,
                          const checkpoint::Checkpoint& prev, const checkpoint::Checkpoint& next,
                          bool in_memory, PublishReport* report);

struct CommitResult {
  bool committed = false;
  std::string pending;  // why not
};

// Commits `step` if every one of its `count` shards has a record of `incarnation` and its
// base step is committed (committing the base first when it can): completes each group,
// then writes the step root. Racing committers write one root: the first wins, the others
// find it. Then moves `latest` forward.
// `sign_key`: as PublishFileOptions::sign_key.
Status CommitStep(Store* store, uint64_t step, uint32_t count, const std::string& incarnation,
                  CommitResult* result, const std::string& sign_key = "");

// The store options the public StoreSettings (arc_v3_sync.hpp) ask for; `create` as
// StoreOptions::create.
StoreOptions ToStoreOptions(const StoreSettings& settings, bool create = false);

using PullReport = PullFilesResult;  // of arc_v3_sync.hpp
using ::arc_v3::PruneResult;
using ::arc_v3::StepVerdict;

// What Pull takes: the public PullFilesOptions (arc_v3_sync.hpp), and what only the library
// and its tests set.
struct PullOptions : PullFilesOptions {
  PullOptions() = default;
  explicit PullOptions(const PullFilesOptions& options) : PullFilesOptions(options) {}
  // The pull's transfers where a test needs other timings or part sizes than `store` gives
  // (unset: ToStoreOptions(store)).
  std::optional<StoreOptions> transfers;
  StoreOptions transfer_options() const { return transfers ? *transfers : ToStoreOptions(store); }
  // Take the anchor route even where DIR's chain costs less: a follower whose chain met a
  // refused step goes around it by the next anchor.
  bool anchor_route = false;
  // Test hooks. `hook` is called at "planned" (the route is chosen, nothing fetched),
  // "fetched" (every object downloaded; a full pull has decoded them by then, a partial
  // pull decodes after it) and "commit" (DIR's new files complete, before
  // the first rename); an error aborts the pull. `after_move` is called after each rename
  // of the commit (a test may end the process there: the next pull finishes the commit).
  std::function<Status(const char* stage)> hook;
  std::function<void(size_t moved)> after_move;
};

// Makes `dir` hold `options.step` (see the top of this file). On any error `dir` is left
// exactly as it was. A DIR whose files are not the step it records is refused
// (kChecksumMismatch) unless options.reset.
Status Pull(Store* store, const std::string& dir, const PullOptions& options, PullReport* report);

// Keeps `dir` at the newest committed step of the store `store_url` names: Pull (with
// `pull`, its step ignored) for each step newer than the one held, in the loop of
// Follower::Follow (arc_v3_sync.hpp), which also says how it polls, waits and gives up. A
// local store that does not exist yet is waited for. `on_event` (may be empty) is told
// every event, with the pull's report for a kPulled one; false ends the loop.
Status Follow(
    const std::string& store_url, const std::string& dir, const PullOptions& pull,
    const FollowOptions& options,
    const std::function<bool(const FollowEvent& event, const PullReport* pulled)>& on_event);

using ::arc_v3::MirrorOptions;
using ::arc_v3::MirrorResult;

// Copies SRC's committed steps up to options.step into DST (MIRRORING.md, "Mirroring").
// `anchor_route`: start at the target's anchor step unless DST holds a step above it
// (never walk below the anchor step). options.store is not used: the stores are open.
Status Mirror(Store* src, Store* dst, const MirrorOptions& options, bool anchor_route,
              MirrorResult* report);

// Mirror for each step of SRC newer than DST's latest, in the loop of FollowLatest.
Status FollowMirror(
    const std::string& src_url, const std::string& dst_url, const MirrorOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const MirrorResult* mirrored)>& on_event);

// kUntrusted where `dir` was pulled trusting keys and `options` name none (and no reset):
// trust is not switched off by leaving the keys out (PROTOCOL.md, "Trust is kept").
Status CheckTrustKept(const std::string& dir, const PullOptions& options);

// The step a directory holds, from its recorded state (kNotFound: none).
Status DirectoryStep(const std::string& dir, uint64_t* step);

struct StepListing {
  uint64_t step = 0;
  bool committed = false;
  StepManifest manifest;            // if committed: its root (records not loaded)
  std::vector<ObjectInfo> objects;  // every object of the step (root, groups, records, containers)
  uint64_t bytes = 0;               // their sizes
};

// Every step that has objects in the store, ascending (lists the store); with
// `load_records`, each committed step's records too (else its root only).
Status ListSteps(Store* store, std::vector<StepListing>* steps, bool load_records = true);

// Checks every committed step's documents as a trusting region would (PROTOCOL.md, "Signed
// steps"): its root signed by one of `trusted_keys` (PEM public key files), its group indexes,
// layouts and records of their signed SHA-256, each record naming its objects by SHA-256,
// and its link to its base root. Objects are not downloaded (a pull checks them). An
// error naming a key file is returned; a step that fails is a verdict.
Status VerifySteps(Store* store, const std::vector<std::string>& trusted_keys,
                   std::vector<StepVerdict>* verdicts);

// Writes a new Ed25519 key pair: `path` (private, mode 0600) and `path`.pub (neither may
// exist: kAlreadyExists); `key_id` gets the id signatures name.
Status GenerateKey(const std::string& path, std::string* key_id);

// Deletes every step before the oldest of the newest `keep_anchors` anchor steps, and
// never the anchor before the newest one or anything after it (a puller that started
// from it may still need its chain). Roots go first, so no puller finds a step whose
// pieces are gone. `dry_run` only reports. With `min_age_seconds`, a step committed less
// than that long ago keeps everything back to its anchor step: a slow region may still be
// fetching the route that step's root named when it started.
Status Prune(Store* store, uint32_t keep_anchors, bool dry_run, PruneResult* report,
             double min_age_seconds = 0);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_SYNC_H_

// arc_v3 sync: a trainer publishes its weights step by step to an object store, and
// rollout engines follow it (src/sync/PROTOCOL.md): from and into tensors in memory
// (Publisher, Follower), or from safetensors files into a region's checkpoint directory
// (PublishFile, PullFiles, FollowFiles: what the `arc_v3` command runs).
//
//   // each trainer rank, after each optimizer step:
//   std::unique_ptr<arc_v3::Publisher> publisher;
//   arc_v3::Publisher::Open("s3://bucket/run7", {/*shard=*/r, /*count=*/n}, &publisher);
//   publisher->Publish(step, {{"layers.0.w", "BF16", {4096, 4096}, w0}, ...}, &result);
//
//   // each rollout engine:
//   std::unique_ptr<arc_v3::Follower> follower;
//   arc_v3::Follower::Open("s3://bucket/run7", {}, &follower);
//   follower->Pull(arc_v3::kLatestStep, &pulled);   // then follower->tensors()
//
// Stores: s3://BUCKET/PREFIX (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN, AWS_REGION), a local store (a path or file://PATH on one machine or a
// shared file system), or (followers) a read-only http(s):// URL.
// Link //:arc_v3_sync (Bazel) or arc_v3::sync (CMake); arc_v3.hpp stays free of it.
#ifndef ARC_V3_SYNC_HPP_5820417396
#define ARC_V3_SYNC_HPP_5820417396

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "arc_v3_checkpoint.hpp"  // NamedTensor

namespace arc_v3 {

// "No step": what step() and last_step() return before there is one, a result's from_step
// for a first pull, a base_step of none. No step number reaches it (steps are at most
// 999999999999, src/sync/PROTOCOL.md).
constexpr uint64_t kNoStep = UINT64_MAX;
// A request for "the newest step" (Follower::Pull, PullFilesOptions::step,
// MirrorOptions::step). Never a field's value in a result: a result names the step taken.
constexpr uint64_t kLatestStep = UINT64_MAX - 1;

// How a store is reached: tries per request (timeouts, lost connections, 5xx) and
// parallel transfers per object.
struct StoreSettings {
  int retries = 5;
  int connections = 8;
};

struct PublisherOptions {
  uint32_t shard = 0, count = 1;  // this trainer rank publishes shard `shard` of `count`
  uint64_t anchor_every = 10;     // also the whole tensors when step % anchor_every == 0
  int effort = kDefaultEffort;    // codec effort 0..3
  int threads = 0;                // 0: all cores
  // The shard's name in a region ("": model-KKKKK-of-NNNNN.safetensors, K = shard + 1).
  std::string file_name;
  // Which start of the trainer this is ("": $ARC_V3_INCARNATION, else torchrun's restart
  // count, else "0"): after a restart mid-step, the new records supersede the old ones.
  std::string incarnation;
  // A PEM Ed25519 private key file ("": steps are not signed): the rank signs its record,
  // and signs the group index or step root it completes after checking the records it
  // read are signed by the same key (every rank of a run holds it).
  std::string sign_key;
  StoreSettings store;
};

struct PublishResult {
  bool committed = false;  // the step is committed (this rank completed it, or another did)
  std::string pending;     // why not yet, e.g. "waiting for shards 1, 3 of 4"
  uint64_t delta_bytes = 0, anchor_bytes = 0, uploaded_bytes = 0;
  double encode_seconds = 0, upload_seconds = 0, commit_seconds = 0, total_seconds = 0;
};

// A trainer rank's publisher. It keeps a copy of the tensors it published last (their
// bytes: as much memory as the rank's tensors), the base of the next delta; its first
// step, and every `anchor_every` steps, carries the tensors whole. Not thread-safe.
class Publisher {
 public:
  // Errors: kInvalidArgument (URL, options).
  static Status Open(const std::string& store_url, const PublisherOptions& options,
                     std::unique_ptr<Publisher>* publisher);
  ~Publisher();
  // Publishes the rank's tensors as its shard of `step` (after the last step it
  // published) and commits the step if every rank's shard is there. Steps published
  // again with the same tensors are no-ops; other tensors: kAlreadyExists. On error
  // nothing it keeps changes.
  Status Publish(uint64_t step, const std::vector<NamedTensor>& tensors, PublishResult* result);
  uint64_t last_step() const;   // kNoStep if none
  uint64_t held_bytes() const;  // the copy it keeps

 private:
  struct Impl;
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct FollowerOptions {
  // Only tensors whose whole name matches this ECMAScript regex ("": all), and of them
  // rows [row_begin, row_end) of the first dimension (a tensor-parallel rank's slice).
  std::string tensors;
  uint64_t row_begin = 0, row_end = UINT64_MAX;
  int threads = 0;
  // The compressed bytes fetched ahead of decoding, per batch of shards: a step holds two
  // batches at once (one being decoded, the next arriving). A shard needing more is read
  // piece by piece as it is decoded.
  uint64_t fetch_ahead_bytes = uint64_t{64} << 20;
  // PEM public key files of the trainers to trust (several: a key rotated mid-run). With
  // any, Pull takes only steps signed by one of them whose every document and byte has
  // its signed SHA-256, never an older step than the one held nor another run (found
  // before the bytes in question are decoded; kUntrusted). None: steps are not authenticated.
  std::vector<std::string> trusted_keys;
  StoreSettings store;
};

// A tensor as a follower holds it: rows [row_begin, row_end) of a tensor of `shape`
// (all rows for a full pull; a slice rounded out to the delta's row blocks otherwise).
struct FollowedTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;  // the whole tensor's
  uint64_t row_begin = 0, row_end = 0;
  void* data = nullptr;
  size_t shard = 0;
  // Matched by FollowerOptions::tensors; the others are held only because a group of a
  // matched one needs their bases.
  bool selected = true;
};

struct FollowResult {
  uint64_t from_step = kNoStep, step = kNoStep;
  bool up_to_date = false;
  std::string route;  // "chain 11 -> 13" or "anchor 10 -> 13"
  // Set when the cheaper route met a damaged object or document and the other route was
  // taken: what was met, and which route replaced which.
  std::string rerouted;
  std::vector<uint64_t> steps;  // applied, in order
  uint64_t fetched_bytes = 0, requests = 0;
  // Of the largest step: its changed elements, and its undo record (the old values it
  // kept until every shard was verified).
  uint64_t changed_elements = 0, undo_bytes = 0;
  double fetch_seconds = 0, decode_seconds = 0, commit_seconds = 0, total_seconds = 0;
  double published_at = 0, committed_at = 0;  // of the step pulled (Unix seconds)
};

// How a follow loop polls: Follower::Follow and FollowFiles.
struct FollowOptions {
  double interval_seconds = 2;  // between polls of the store's `latest` pointer
  uint64_t until = kNoStep;     // return once this step or a later one is held (kNoStep: never)
  // Polls failing in a row before giving up: the store unavailable, or a committed step
  // that cannot be pulled because something it names is missing (kNotFound).
  int max_failures = 10;
  // Called between polls (every 0.1 s at most); true stops the loop (it returns Ok). For a
  // caller that must react to a signal while the loop waits.
  std::function<bool()> stop_requested;
  // "HOST:PORT" to take the store's bucket notifications on (radosgw's push endpoint, S3
  // events through an SNS HTTP subscription: docs/regions.md); empty: none. An event naming
  // `latest` or a step root ends the wait early: it only triggers the next poll, which
  // stays the truth (src/sync/PROTOCOL.md, Pulling). kInvalidArgument if it cannot listen.
  std::string events_listen;
};

// What a follow loop reports as it goes.
struct FollowEvent {
  enum class Kind {
    kPulled,    // a newer step is held: `step`, `steps_behind`, `lag_seconds`
    kWaiting,   // nothing to pull yet (no store, nothing committed, a step named but not
                // yet readable): `message`; said once per wait
    kRetrying,  // a poll failed and will be tried again: `message`, `failures` in a row
    kRefused,   // with trusted keys: `step` failed verification (`message` says why); the
                // step held is kept, and the loop goes on to the next step that verifies
  };
  Kind kind = Kind::kPulled;
  uint64_t step = kNoStep;
  uint64_t steps_behind = 0;  // of the step held before (0 for a first pull)
  double lag_seconds = 0;     // from the step's publish to its pull's end
  std::string message;
  int failures = 0;
};

// A rollout engine's follower: holds the tensors of the step it pulled last and updates
// them in place. A step is all or nothing: each piece is verified before it is written, and
// the old values it replaces stay in an undo record (a few bytes per changed value) until
// every shard is done, so an error puts them back. Pieces are fetched ahead in batches of
// at most 64 MiB while the last batch is decoded: a step holds two such batches, a piece
// per thread and the undo record, never a second copy of the model. A long route commits
// step by step, so on an error the tensors hold the last step that was complete: on an
// anchor route that can be older than the step held before (step() says which). The
// tensors must not be read during Pull. Not thread-safe.
class Follower {
 public:
  // Memory for a tensor the follower holds anew (first pull, added or reshaped tensors):
  // `bytes` bytes for rows [row_begin, row_end) of `shape`; `owner` keeps them alive.
  using Allocator =
      std::function<Status(const std::string& name, const std::string& dtype,
                           const std::vector<uint64_t>& shape, uint64_t row_begin, uint64_t row_end,
                           uint64_t bytes, void** data, std::shared_ptr<void>* owner)>;

  static Status Open(const std::string& store_url, const FollowerOptions& options,
                     std::unique_ptr<Follower>* follower);
  ~Follower();
  // Where new tensors' memory comes from (default: the follower allocates it).
  void set_allocator(Allocator allocator);
  // Makes the tensors step `step` (kLatestStep: the newest) by the cheapest route. Each
  // step of the route applies all or nothing; on an error the follower holds the step it
  // held or a newer one of the route, never an older one (an anchor route that starts at
  // or below the held step is built in new memory until it passes it).
  // Errors: kNotFound (no such step), kChecksumMismatch (wrong base), kCorrupt*,
  // kUnavailable / kPermissionDenied (the store), kUntrusted (trusted_keys refuse it).
  Status Pull(uint64_t step, FollowResult* result);
  // Pulls each step newer than the one held as it is committed, until options.until or
  // until `on_event` (may be empty) returns false for an event it is told: `pulled` is the
  // pull's result for a kPulled event, else null. Polls cost one conditional GET (and,
  // while the pointer stands still, one HEAD for the step after it, which a racing commit
  // may have left it behind). With trusted keys a step that fails verification is a
  // kRefused event, not an error: whoever can write the store cannot stop the loop (it is
  // tried again once `latest` changes). Errors: Pull's, or kUnavailable / kNotFound after
  // max_failures polls failed in a row; on an error the tensors hold the last step pulled.
  Status Follow(
      const FollowOptions& options,
      const std::function<bool(const FollowEvent& event, const FollowResult* pulled)>& on_event);
  uint64_t step() const;  // kNoStep before the first pull
  // The tensors held, by shard then file order. Pointers stay valid across pulls unless
  // a tensor is added, reshaped or dropped by a step.
  std::vector<FollowedTensor> tensors() const;

 private:
  struct Impl;
  explicit Follower(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- Checkpoint files through a store ---
// A trainer shard publishes its safetensors file of each step; a region pulls a step into
// its checkpoint directory DIR: the shards' files as published, bit for bit (or, partial,
// the tensors and rows it serves), with what it holds recorded in DIR/.arc_v3.

struct PublishFileOptions {
  uint64_t step = 0;
  std::string next;               // this shard's safetensors file of `step`
  std::string prev;               // its file of the base step; "": an anchor only
  uint64_t base_step = kNoStep;   // the step `prev` is; kNoStep: step - 1
  uint32_t shard = 0, count = 1;  // this is shard `shard` of `count`
  std::string incarnation;        // as PublisherOptions::incarnation
  // Also an anchor when step % anchor_every == 0 (0: only without prev).
  uint64_t anchor_every = 10;
  // The sharded checkpoint's model.safetensors.index.json, carried to full pulls ("": the
  // one beside `next` if it names next's file; no_index: none).
  std::string index;
  bool no_index = false;
  std::string work_dir;  // where containers are written before upload ("": $TMPDIR or /tmp)
  // Threads, effort, format and grouping of the delta (its pieces are always stored by
  // row, and scratch files are not synced: row_order, sync and overwrite do not apply).
  CheckpointOptions checkpoint;
  // As PublisherOptions::sign_key; `trusted_keys`: PEM public key files whose signed records
  // a completer also takes (a key rotated mid-step).
  std::string sign_key;
  std::vector<std::string> trusted_keys;
  StoreSettings store;
};

// An object of a shard's record: its key in the store ("": none) and size.
struct StoredObject {
  std::string key;
  uint64_t bytes = 0;
};

struct PublishFileResult {
  uint64_t step = 0;
  uint32_t shard = 0, count = 0;
  std::string file;  // the shard's name in a region
  uint64_t file_bytes = 0;
  StoredObject delta, anchor, index;  // its containers, and the index it carries
  bool committed = false;             // the step is committed (by this call or another shard)
  std::string pending;                // why not, e.g. "waiting for shards 1, 3 of 4"
  // The shard had published this same file for the step before (same name, base step and
  // tensors): nothing was uploaded, the figures are the first publish's, and `note` says
  // what of this call's options that publish overrides.
  bool already_published = false;
  std::string note;
  uint64_t uploaded_bytes = 0, uploaded_objects = 0;
  double encode_seconds = 0, hash_seconds = 0, upload_seconds = 0, commit_seconds = 0,
         total_seconds = 0;
};

// Publishes one shard's file for a step and commits the step if it is complete. A local
// store is created if missing. Errors: kChecksumMismatch (`prev` is not what this shard
// published for the base step), kNotFound (a base step it never published),
// kAlreadyExists (another file for a published shard, naming what differs), the store's.
Status PublishFile(const std::string& store_url, const PublishFileOptions& options,
                   PublishFileResult* result);

struct PullFilesOptions {
  uint64_t step = kLatestStep;
  // Partial pull: only tensors whose whole name matches this ECMAScript regex ("": all),
  // and of them rows [row_begin, row_end) of the first dimension.
  std::string tensors;
  uint64_t row_begin = 0, row_end = UINT64_MAX;
  bool reset = false;  // rebuild DIR from the nearest anchor, whatever it holds
  // Take a DIR that holds files but was never pulled into (kAlreadyExists otherwise):
  // files of the step's names are replaced, others left alone.
  bool force = false;
  // As FollowerOptions::trusted_keys (an older step or another run's is taken with reset).
  std::vector<std::string> trusted_keys;
  CheckpointOptions checkpoint;  // threads, and sync (of the files DIR gets); the rest do not apply
  StoreSettings store;
};

struct PullFilesResult {
  uint64_t from_step = kNoStep;  // DIR's step before (kNoStep: none)
  uint64_t to_step = kNoStep;
  bool up_to_date = false;  // DIR already held the step
  std::string route;        // e.g. "chain 11 -> 13" or "anchor 10 -> 13"
  // Set when the cheaper route met a damaged object or document and the other was taken:
  // what was met, and which route replaced which.
  std::string rerouted;
  std::vector<uint64_t> steps;  // applied, in order
  uint64_t fetched_bytes = 0, fetched_objects = 0, requests = 0;
  uint64_t checkpoint_bytes = 0;  // of the files DIR holds now
  // A full pull decodes each object while the next ones download: fetch_seconds runs from
  // the first request to the last object's arrival, verify_seconds sums the objects' checks
  // (done as each arrives), and wait_seconds is the time decoding waited for an object.
  double fetch_seconds = 0, verify_seconds = 0, decode_seconds = 0, write_seconds = 0;
  double commit_seconds = 0, total_seconds = 0, wait_seconds = 0;
  double published_at = 0, committed_at = 0;  // of the step pulled (Unix seconds)
};

// Makes DIR (created if needed) hold options.step by the cheapest verified route: the
// deltas after DIR's step, or the nearest anchor and the deltas after it. DIR records
// the step only after a verified apply; on any error it is left exactly as it was. Errors:
// Follower::Pull's, kChecksumMismatch for a DIR whose files are not the step it records
// (reset rebuilds it), kAlreadyExists for a DIR of other files (see force).
Status PullFiles(const std::string& store_url, const std::string& dir,
                 const PullFilesOptions& options, PullFilesResult* result);

// Keeps DIR at the newest committed step: PullFiles (its options.step ignored) for each
// step newer than the one held, in the loop of Follower::Follow, which says how it polls,
// waits and gives up. A local store that does not exist yet is waited for. `on_event`
// (may be empty) is told every event, with the pull's result for a kPulled one; false
// ends the loop.
Status FollowFiles(
    const std::string& store_url, const std::string& dir, const PullFilesOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const PullFilesResult* pulled)>& on_event);

// --- A regional mirror ---
// Copies the committed steps of the trainer's store SRC into a store DST in a region, byte
// for byte (src/sync/MIRRORING.md, "Mirroring"): the region's hosts then pull and follow DST
// as they would SRC, signed steps included, and each step crosses into the region once.
// SRC is any store a puller reads (http(s):// included: a mirror never lists); DST any
// writable store (a local one is created if missing). DST stays a valid store at every
// moment, a mirror stopped anywhere resumes where it was, and DST is pruned on its own.

struct MirrorOptions {
  uint64_t step = kLatestStep;  // mirror up to this step (kLatestStep: SRC's newest)
  // As FollowerOptions::trusted_keys: with any, only steps signed by one of them whose
  // every document and byte has its signed SHA-256 are copied (kUntrusted otherwise,
  // before a byte of what fails reaches DST). None: the XXH3s and any SHA-256 are checked.
  std::vector<std::string> trusted_keys;
  std::string work_dir;  // where objects wait between the stores ("": $TMPDIR or /tmp)
  int parallel = 8;      // objects copied at once
  StoreSettings store;   // for both stores
};

struct MirrorResult {
  uint64_t from_step = kNoStep;  // DST's latest before (kNoStep: none)
  uint64_t to_step = kNoStep;    // DST's latest after
  bool up_to_date = false;       // DST already held the step
  std::vector<uint64_t> steps;   // copied, ascending
  // Keys written into DST (objects and documents), and those DST already held (an
  // earlier run stopped midway, or a retried write) and were not fetched or written again.
  uint64_t copied_objects = 0, copied_bytes = 0, skipped_objects = 0, skipped_bytes = 0;
  uint64_t fetched_bytes = 0;  // read from SRC (what crossed into the region)
  double total_seconds = 0;
  double published_at = 0, committed_at = 0;  // of to_step (Unix seconds)
};

// Mirrors SRC into DST up to options.step: the steps on its chain after the one DST holds
// (from its anchor step when DST holds none of them), in ascending order, each one's
// objects, then its documents, then its root, then DST's `latest`. Errors: kNotFound (no
// such step in SRC), kAlreadyExists (DST holds other bytes at a key: another run's step),
// kCorruptChunk / kCorruptHeader / kTruncated (SRC's bytes are not what its documents
// name: nothing of them is written), kUntrusted (trusted_keys refuse a step), the stores'.
// On an error the steps copied before stay, and DST is valid.
Status MirrorSteps(const std::string& src_url, const std::string& dst_url,
                   const MirrorOptions& options, MirrorResult* result);

// Keeps DST at SRC's newest step: MirrorSteps (options.step ignored) for each step of SRC
// newer than DST's latest, in the loop of Follower::Follow, which says how it polls, waits
// and gives up; a kPulled event's step is the step mirrored. A local SRC that does not
// exist yet is waited for. With trusted keys, a step that does not verify is a kRefused
// event and the loop goes on. `on_event` (may be empty) is told every event, with the
// mirror's result for a kPulled one; false ends the loop.
Status FollowMirror(
    const std::string& src_url, const std::string& dst_url, const MirrorOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const MirrorResult* mirrored)>& on_event);

// --- Looking after a store ---

struct StepShardInfo {
  uint32_t shard = 0;
  std::string file;
  uint64_t file_bytes = 0;
  uint64_t delta_bytes = 0, anchor_bytes = 0;  // 0: none
};

// A step that has objects in a store.
struct StepInfo {
  uint64_t step = 0;
  bool committed = false;
  uint64_t objects = 0, bytes = 0;  // every object of the step, and their sizes
  // Of a committed step, from its root:
  uint64_t base_step = kNoStep, anchor_step = kNoStep;  // base: kNoStep for an anchor alone
  bool anchor = false;                                  // every shard carries an anchor
  uint32_t count = 0;                                   // shards
  std::string incarnation;
  uint64_t run = 0;                            // the run id its first step drew
  uint64_t delta_bytes = 0, anchor_bytes = 0;  // summed over its shards
  double published_at = 0, committed_at = 0;
  std::vector<StepShardInfo> shards;  // with ListSteps' `shards` only
};

// Every step that has objects in the store, ascending (lists the store; an http(s):// store
// cannot list: kInvalidArgument); with `shards`, each committed step's shard records too
// (its group indexes and records are read).
Status ListSteps(const std::string& store_url, const StoreSettings& settings, bool shards,
                 std::vector<StepInfo>* steps);

// What VerifySteps says of a committed step: verified (by the key `keyid`), or why not.
struct StepVerdict {
  uint64_t step = 0;
  Status status;
  std::string keyid;
};
// Checks every committed step's documents as a region trusting `trusted_keys` (PEM public
// key files) would: its root's signature, the signed SHA-256 of every document it names,
// each record naming its objects by SHA-256, its link to its base root. Objects are not
// downloaded (a pull checks them). A step that fails is a verdict; an error names a key
// file or the store.
Status VerifySteps(const std::string& store_url, const StoreSettings& settings,
                   const std::vector<std::string>& trusted_keys,
                   std::vector<StepVerdict>* verdicts);

struct PruneResult {
  uint64_t keep_from = kNoStep;  // steps before it were deleted (kNoStep: nothing to prune)
  std::vector<uint64_t> deleted_steps;
  uint64_t deleted_objects = 0, deleted_bytes = 0;
};
// Deletes every step before the oldest of the newest `keep_anchors` anchor steps, and
// never the anchor before the newest one or anything after it (a puller that started from
// it may still need its chain). Roots go first, so no puller finds a step whose pieces are
// gone. `dry_run` only reports. A step committed less than `min_age_seconds` ago keeps
// everything back to its anchor step (a slow region may still be fetching its route).
Status PruneSteps(const std::string& store_url, const StoreSettings& settings,
                  uint32_t keep_anchors, bool dry_run, double min_age_seconds, PruneResult* result);

// Writes a new Ed25519 key pair for signed steps: `path`, the private key (mode 0600, for
// PublisherOptions::sign_key) and `path`.pub (for FollowerOptions::trusted_keys), PEM files
// as `openssl genpkey -algorithm ed25519` writes. Neither may exist (kAlreadyExists).
// `key_id` gets the id signatures name.
Status GenerateSigningKey(const std::string& path, std::string* key_id);

}  // namespace arc_v3

#endif  // ARC_V3_SYNC_HPP_5820417396

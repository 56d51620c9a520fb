// The sync subcommands (see sync_commands.h): argument checks, calls into arc_v3_sync.hpp,
// and their text and JSON reports.
#include "tools/cli/sync_commands.h"

#include <cinttypes>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tools/cli/cli_common.h"

namespace arc_v3 {
namespace {

using Json = nlohmann::ordered_json;

int Fail(const char* command, bool json, const Status& s) {
  PrintError(command, s);
  if (json) {
    Json j = {{"command", command},
              {"ok", false},
              {"error", ErrorName(s.code())},
              {"message", s.message()},
              {"exit_code", ExitCodeFor(s)}};
    if (!HintFor(command, s).empty()) j["hint"] = HintFor(command, s);
    std::cout << j.dump() << std::endl;
  }
  return ExitCodeFor(s);
}

Json PullJson(const PullFilesResult& r) {
  return {{"command", "pull"},
          {"ok", true},
          {"from_step", r.from_step == kNoStep ? Json(nullptr) : Json(r.from_step)},
          {"step", r.to_step},
          {"up_to_date", r.up_to_date},
          {"route", r.route},
          {"rerouted", r.rerouted.empty() ? Json(nullptr) : Json(r.rerouted)},
          {"steps_applied", r.steps},
          {"fetched_bytes", r.fetched_bytes},
          {"fetched_objects", r.fetched_objects},
          {"requests", r.requests},
          {"checkpoint_bytes", r.checkpoint_bytes},
          {"seconds",
           {{"fetch", r.fetch_seconds},
            {"verify", r.verify_seconds},
            {"decode", r.decode_seconds},
            {"wait", r.wait_seconds},
            {"write", r.write_seconds},
            {"commit", r.commit_seconds},
            {"total", r.total_seconds}}},
          {"published_at", r.published_at},
          {"committed_at", r.committed_at}};
}

std::string Hex16(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, value);
  return text;
}

void PrintPull(const PullFilesResult& r) {
  if (r.up_to_date) {
    std::printf("pull: already at step %" PRIu64 " (%s)\n", r.to_step,
                HumanBytes(r.checkpoint_bytes).c_str());
    return;
  }
  std::printf("pull: step %" PRIu64 " by %s: fetched %s in %" PRIu64
              " requests, checkpoint %s, %.3f s "
              "(fetch %.3f, verify %.3f, decode %.3f, write %.3f, commit %.3f; decode waited %.3f "
              "for objects)\n",
              r.to_step, r.route.c_str(), HumanBytes(r.fetched_bytes).c_str(), r.requests,
              HumanBytes(r.checkpoint_bytes).c_str(), r.total_seconds, r.fetch_seconds,
              r.verify_seconds, r.decode_seconds, r.write_seconds, r.commit_seconds,
              r.wait_seconds);
  if (!r.rerouted.empty()) std::printf("pull: rerouted: %s\n", r.rerouted.c_str());
}

constexpr char kStoreHelp[] =
    "Where the steps live: a local store (a directory's path, or file://PATH),\n"
    "s3://BUCKET/PREFIX (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,\n"
    "AWS_SESSION_TOKEN, AWS_REGION), or a read-only http(s):// URL in front of the bucket\n"
    "(pull, follow)";

Json MirrorJson(const MirrorResult& r) {
  return {{"command", "mirror"},
          {"ok", true},
          {"from_step", r.from_step == kNoStep ? Json(nullptr) : Json(r.from_step)},
          {"step", r.to_step == kNoStep ? Json(nullptr) : Json(r.to_step)},
          {"up_to_date", r.up_to_date},
          {"steps_copied", r.steps},
          {"copied_objects", r.copied_objects},
          {"copied_bytes", r.copied_bytes},
          {"skipped_objects", r.skipped_objects},
          {"skipped_bytes", r.skipped_bytes},
          {"fetched_bytes", r.fetched_bytes},
          {"seconds", r.total_seconds},
          {"published_at", r.published_at},
          {"committed_at", r.committed_at}};
}

void PrintMirror(const char* command, const MirrorResult& r, const std::string& dst) {
  if (r.steps.empty()) {
    std::printf("%s: %s already holds step %" PRIu64 "\n", command, dst.c_str(), r.to_step);
    return;
  }
  std::string steps;
  for (uint64_t step : r.steps) steps += (steps.empty() ? "" : ", ") + std::to_string(step);
  std::printf("%s: step%s %s into %s: copied %" PRIu64 " objects (%s), skipped %" PRIu64
              " already there (%s), fetched %s, %.3f s\n",
              command, r.steps.size() > 1 ? "s" : "", steps.c_str(), dst.c_str(), r.copied_objects,
              HumanBytes(r.copied_bytes).c_str(), r.skipped_objects,
              HumanBytes(r.skipped_bytes).c_str(), HumanBytes(r.fetched_bytes).c_str(),
              r.total_seconds);
  std::fflush(stdout);
}

}  // namespace

SyncCommands::SyncCommands(CLI::App* app) {
  AddPublish(app);
  AddPull(app);
  AddFollow(app);
  AddMirror(app);
  AddLog(app);
  AddKeygen(app);
  AddPrune(app);
}

void SyncCommands::AddCommon(CLI::App* cmd, bool threads) {
  cmd->add_flag("--json", json_, "Print a JSON summary on stdout instead of text");
  cmd->add_flag("-q,--quiet", quiet_, "No text summary");
  cmd->add_option("--retries", retries_,
                  "Tries of a store request that timed out or got a 5xx answer (default 5)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--connections", connections_, "Parallel transfers per object (default 8)")
      ->check(CLI::Range(1, 256));
  if (threads) {
    cmd->add_option("-T,--threads", threads_, "Worker threads (default 0 = all cores)")
        ->check(CLI::NonNegativeNumber);
  }
}

void SyncCommands::AddTrustedKeys(CLI::App* cmd, const std::string& help, bool env) {
  CLI::Option* keys = cmd->add_option("--trusted-keys", trusted_keys_, help);
  CLI::Option* alias = cmd->add_option("--trust", trust_alias_, "1.x's --trusted-keys")->group("");
  if (env) {
    keys->envname("ARC_V3_TRUSTED_KEYS");
    alias->envname("ARC_V3_TRUST");
  }
}

void SyncCommands::AddPublish(CLI::App* app) {
  publish_ = app->add_subcommand(
      "publish",
      "A trainer shard publishes its safetensors file for step N: the delta against --prev\n"
      "(and an anchor every --anchor-every steps), or an anchor alone without --prev. The\n"
      "shard that completes the step commits it. A local store is created if missing.\n"
      "Publishing the same file (name, base step, tensors) again is a no-op that keeps what\n"
      "was published first, whatever --anchor-every, --effort or --format say now; another\n"
      "file for a published shard and step is refused (exit 7), naming what differs.");
  publish_->add_option("STORE", store_, kStoreHelp)->required();
  publish_->add_option("--step", step_, "The step's number")->required();
  publish_->add_option("--next", next_, "This shard's .safetensors file of the step")
      ->required()
      ->check(CLI::ExistingFile);
  publish_->add_option("--prev", prev_, "This shard's file of the base step (omit: an anchor only)")
      ->check(CLI::ExistingFile);
  publish_->add_option("--base-step", base_step_, "The step --prev is (default N-1)");
  publish_->add_option("--shard", shard_, "K/COUNT: this is shard K of COUNT (default 0/1)");
  publish_->add_option(
      "--incarnation", incarnation_,
      "Which start of the trainer publishes (default: $ARC_V3_INCARNATION, else\n"
      "torchrun's restart count, else 0): a trainer restarted mid-step publishes\n"
      "under a new one, whose records supersede the old ones' until the step commits");
  publish_->add_option("--anchor-every", anchor_every_,
                       "Also write an anchor when N is a multiple of this (default 10; 0: never,\n"
                       "but for a step without --prev)");
  publish_
      ->add_option("--index", index_,
                   "The sharded checkpoint's index to carry to full pulls (default: the\n"
                   "model.safetensors.index.json beside --next, if it names --next's file)")
      ->check(CLI::ExistingFile);
  publish_->add_flag("--no-index", no_index_, "Carry no index file");
  publish_->add_option("--work-dir", work_dir_,
                       "Where containers are written before upload (default $TMPDIR)");
  publish_->add_option("-e,--effort", effort_, "arc_v3 codec effort 0..3 (default 2)")
      ->check(CLI::Range(0, 3));
  publish_
      ->add_option("--sign-key", sign_key_,
                   "Sign the step with this Ed25519 private key (`arc_v3 keygen`; default\n"
                   "$ARC_V3_SIGN_KEY): every shard of the run holds it")
      ->envname("ARC_V3_SIGN_KEY");
  AddTrustedKeys(publish_,
                 "A completer also takes records signed by a key of this PEM file of public keys\n"
                 "(a key rotated mid-step; repeatable)",
                 false);
  publish_
      ->add_option("--format", format_,
                   "Payload format of BF16 deltas: arc_v3 (default) or arc_v3_published (ARCv3 as\n"
                   "published: XOR fields and a zstd/lz4 race; smaller tensors are not grouped)")
      ->check(CLI::IsMember({"arc_v3", "arc_v3_published"}));
  AddCommon(publish_, true);
}

void SyncCommands::AddPull(CLI::App* app) {
  pull_ = app->add_subcommand(
      "pull",
      "Make DIR hold step N (default: the latest) as the published shard files, bit for bit,\n"
      "by the cheapest verified route: the deltas after DIR's step, or the nearest anchor and\n"
      "the deltas after it. DIR records its step only after a verified apply; on any error it\n"
      "is left as it was. A DIR whose files are not the step it records is refused.");
  pull_->add_option("STORE", store_, kStoreHelp)->required();
  pull_->add_option("DIR", dir_, "The region's checkpoint directory (created if needed)")
      ->required();
  pull_->add_option("--step", step_, "The step to hold (default: the latest)");
  pull_->add_option("--tensors", tensors_,
                    "Partial pull: only tensors whose whole name matches this regex (ECMAScript);\n"
                    "fetches only their pieces (and the small tensors a group may need)");
  pull_->add_option("--rows", rows_,
                    "Partial pull: rows A:B of the first dimension (A: or :B allowed)");
  pull_->add_flag("--reset", reset_,
                  "Ignore what DIR holds and rebuild it from the nearest anchor");
  pull_->add_flag("-f,--force", force_,
                  "Pull into a DIR that holds other files (refused otherwise): files of the\n"
                  "step's names are replaced, others left alone");
  pull_->add_flag("--no-sync", no_sync_, "Skip fsync (benchmarks only: not crash-safe)");
  AddTrustedKeys(pull_,
                 "Take only steps signed by a key of this PEM file of public keys (repeatable:\n"
                 "a rotation), every byte checked against its signed SHA-256, never an older\n"
                 "step or another run than DIR's (--reset takes them); else exit 8, DIR\n"
                 "unchanged. DIR then stays trusting: a later pull without --trusted-keys is\n"
                 "refused (exit 8) unless --reset. ARC_V3_TRUSTED_KEYS set but empty is refused\n"
                 "(exit 8)",
                 true);
  AddCommon(pull_, true);
}

void SyncCommands::AddFollow(CLI::App* app) {
  follow_ = app->add_subcommand(
      "follow",
      "Keep DIR in step with the store: poll its `latest` pointer (conditional requests), pull\n"
      "each new step and print its lag and bytes. Exits non-zero on an error it cannot recover\n"
      "from; retries an unreachable store --max-failures times in a row.");
  follow_->add_option("STORE", store_, kStoreHelp)->required();
  follow_->add_option("DIR", dir_, "The region's checkpoint directory")->required();
  follow_->add_option("--interval", interval_, "Seconds between polls (default 2)")
      ->check(CLI::PositiveNumber);
  follow_->add_option(
      "--events", events_,
      "Also listen on HOST:PORT for the store's bucket notifications (docs/regions.md):\n"
      "one naming `latest` or a step root triggers a poll at once; polling goes on");
  follow_->add_option("--until", until_, "Exit once DIR holds this step or a later one");
  follow_->add_option("--tensors", tensors_, "As pull --tensors");
  follow_->add_option("--rows", rows_, "As pull --rows");
  follow_->add_flag("--no-sync", no_sync_, "Skip fsync (benchmarks only: not crash-safe)");
  follow_->add_flag("-f,--force", force_, "As pull --force");
  AddTrustedKeys(follow_,
                 "As pull --trusted-keys (without it, steps are not authenticated); a step that\n"
                 "does not verify is reported and skipped, DIR kept, and the follow goes on",
                 true);
  follow_
      ->add_option("--max-failures", max_failures_,
                   "Give up after this many failed polls in a row (default 10)")
      ->check(CLI::PositiveNumber);
  AddCommon(follow_, true);
}

void SyncCommands::AddMirror(CLI::App* app) {
  mirror_ = app->add_subcommand(
      "mirror",
      "Copy the trainer's committed steps from SRC into DST, a store in the region, byte for\n"
      "byte (each step crosses into the region once; hosts then pull and follow DST as they\n"
      "would SRC). DST is a valid store at every moment: a mirror stopped anywhere resumes.\n"
      "Prune DST on its own (arc_v3 prune DST).");
  mirror_
      ->add_option("SRC", store_,
                   "The trainer's store (s3://, local, or a read-only http(s):// URL)")
      ->required();
  mirror_->add_option("DST", dst_, "The region's store (s3:// or local; a local one is created)")
      ->required();
  mirror_->add_flag("--follow", follow_loop_,
                    "Keep mirroring each new step (polls SRC's `latest`, as follow)");
  mirror_->add_option("--step", step_,
                      "Mirror up to this step (default: SRC's newest; not with --follow)");
  mirror_->add_option("--interval", interval_, "With --follow: seconds between polls (default 2)")
      ->check(CLI::PositiveNumber);
  mirror_->add_option(
      "--events", events_,
      "With --follow: also listen on HOST:PORT for SRC's bucket notifications\n"
      "(docs/regions.md): one naming `latest` or a step root triggers a poll at once");
  mirror_->add_option("--until", until_,
                      "With --follow: exit once DST holds this step or a later one");
  mirror_
      ->add_option("--max-failures", max_failures_,
                   "With --follow: give up after this many failed polls in a row (default 10)")
      ->check(CLI::PositiveNumber);
  AddTrustedKeys(mirror_,
                 "Copy only steps signed by a key of this PEM file of public keys (repeatable),\n"
                 "every byte checked against its signed SHA-256 (exit 8 otherwise; with --follow,\n"
                 "reported and skipped)",
                 true);
  mirror_->add_option("--work-dir", work_dir_,
                      "Where objects wait between the stores (default $TMPDIR)");
  mirror_->add_option("--parallel", parallel_, "Objects copied at once (default 8)")
      ->check(CLI::Range(1, 256));
  AddCommon(mirror_, false);
}

void SyncCommands::AddLog(CLI::App* app) {
  log_ = app->add_subcommand("log", "The store's steps: base, anchors, bytes per step and shard");
  log_->add_option("STORE", store_, "s3:// or local store (http(s):// cannot list)")->required();
  log_->add_flag("--verify", verify_,
                 "Say of each committed step whether it verifies against --trusted-keys: its\n"
                 "root's signature and the SHA-256 of every document it names (exit 8 if one\n"
                 "does not)");
  AddTrustedKeys(log_, "A PEM file of trusted public keys (repeatable)", true);
  AddCommon(log_, false);
}

void SyncCommands::AddKeygen(CLI::App* app) {
  keygen_ = app->add_subcommand(
      "keygen",
      "Write a new Ed25519 key pair for signed steps: KEY (the private key, mode 0600, for\n"
      "publish --sign-key) and KEY.pub (for pull/follow --trusted-keys). PEM files, as `openssl\n"
      "genpkey -algorithm ed25519` writes; neither may exist.");
  keygen_->add_option("KEY", key_path_, "The private key's path")->required();
  keygen_->add_flag("--json", json_, "Print a JSON summary on stdout instead of text");
}

void SyncCommands::AddPrune(CLI::App* app) {
  prune_ = app->add_subcommand(
      "prune",
      "Delete old steps: keep the newest K anchors and every step after the oldest of them,\n"
      "and never the anchor before the newest one or anything after it (a region that began\n"
      "there may still need that chain)");
  prune_->add_option("STORE", store_, "s3:// or local store")->required();
  prune_->add_option("--keep-anchors", keep_anchors_, "K (at least 1; default 2)")
      ->check(CLI::PositiveNumber);
  prune_->add_option("--min-age", min_age_,
                     "DURATION (90s, 15m, 2h, 1d; default 0): a step committed less than this ago\n"
                     "keeps its chain back to its anchor (a slow region may still be fetching it)");
  prune_->add_flag("--dry-run", dry_run_, "Only say what would be deleted");
  AddCommon(prune_, false);
}

bool SyncCommands::parsed() const {
  return publish_->parsed() || pull_->parsed() || follow_->parsed() || mirror_->parsed() ||
         log_->parsed() || prune_->parsed() || keygen_->parsed();
}

int SyncCommands::Run() {
  trusted_keys_.insert(trusted_keys_.end(), trust_alias_.begin(), trust_alias_.end());
  if (keygen_->parsed()) return RunKeygen();
  if (publish_->parsed()) return RunPublish();
  PullFilesOptions pull;
  pull.checkpoint.threads = threads_;
  pull.checkpoint.sync = !no_sync_;
  pull.store = Settings();
  pull.tensors = tensors_;
  if (!rows_.empty() && !ParseRows(rows_, &pull.row_begin, &pull.row_end)) {
    std::fprintf(stderr, "arc_v3 %s: --rows wants A:B with A <= B, got '%s'\n", Name(),
                 rows_.c_str());
    return kExitUsage;
  }
  pull.force = force_;
  pull.trusted_keys = trusted_keys_;
  // An emptied variable is no way to switch trust off: a region's settings that lose the
  // key must not quietly take anyone's steps.
  const bool trusting_command =
      pull_->parsed() || follow_->parsed() || mirror_->parsed() || (log_->parsed() && verify_);
  for (const char* name : {"ARC_V3_TRUSTED_KEYS", "ARC_V3_TRUST"}) {
    const char* env = std::getenv(name);
    if (trusting_command && trusted_keys_.empty() && env != nullptr &&
        std::string(env).find_first_not_of(" \t\n") == std::string::npos) {
      return Fail(Name(), json_,
                  Status(ErrorCode::kUntrusted,
                         std::string(name) + " is set but empty: name the trusted public key "
                                             "file(s), or unset it to pull without trust"));
    }
  }
  if (pull_->parsed()) return RunPull(pull);
  if (follow_->parsed()) return RunFollow(pull);
  if (mirror_->parsed()) return RunMirror();
  if (log_->parsed()) return verify_ ? RunVerify() : RunLog();
  return RunPrune();
}

StoreSettings SyncCommands::Settings() const {
  StoreSettings settings;
  settings.retries = retries_;
  settings.connections = connections_;
  return settings;
}

const char* SyncCommands::Name() const {
  return publish_->parsed()  ? "publish"
         : pull_->parsed()   ? "pull"
         : follow_->parsed() ? "follow"
         : mirror_->parsed() ? "mirror"
         : log_->parsed()    ? "log"
         : keygen_->parsed() ? "keygen"
                             : "prune";
}

int SyncCommands::RunKeygen() {
  std::string id;
  const Status s = GenerateSigningKey(key_path_, &id);
  if (!s.ok()) return Fail(Name(), json_, s);
  if (json_) {
    std::cout << Json{{"command", "keygen"},
                      {"ok", true},
                      {"private_key", key_path_},
                      {"public_key", key_path_ + ".pub"},
                      {"key_id", id}}
                     .dump(2)
              << std::endl;
  } else {
    std::printf(
        "keygen: wrote %s (private: keep it with the trainer) and %s.pub "
        "(for --trusted-keys); key id %s\n",
        key_path_.c_str(), key_path_.c_str(), id.c_str());
  }
  return kExitOk;
}

int SyncCommands::RunPublish() {
  PublishFileOptions o;
  unsigned k = 0, count = 0;
  char tail = 0;
  if (std::sscanf(shard_.c_str(), "%u/%u%c", &k, &count, &tail) != 2 || count == 0 || k >= count) {
    std::fprintf(stderr, "arc_v3 publish: --shard wants K/COUNT with K < COUNT, got '%s'\n",
                 shard_.c_str());
    return kExitUsage;
  }
  o.step = step_;
  o.next = next_;
  o.prev = prev_;
  o.base_step = base_step_;
  o.shard = k;
  o.count = count;
  o.anchor_every = anchor_every_;
  o.incarnation = incarnation_;
  o.index = index_;
  o.no_index = no_index_;
  o.work_dir = work_dir_;
  o.checkpoint.threads = threads_;
  o.checkpoint.effort = effort_;
  o.checkpoint.format = format_ == "arc_v3_published" ? Format::kPublished : Format::kDefault;
  o.store = Settings();
  o.sign_key = sign_key_;
  o.trusted_keys = trusted_keys_;
  PublishFileResult r;
  const Status s = PublishFile(store_, o, &r);
  if (!s.ok()) return Fail(Name(), json_, s);
  const auto ref = [](const StoredObject& object) {
    return object.key.empty() ? Json(nullptr) : Json{{"key", object.key}, {"bytes", object.bytes}};
  };
  if (json_) {
    const Json j = {{"command", "publish"},
                    {"ok", true},
                    {"step", r.step},
                    {"shard", r.shard},
                    {"count", r.count},
                    {"file", r.file},
                    {"file_bytes", r.file_bytes},
                    {"delta", ref(r.delta)},
                    {"anchor", ref(r.anchor)},
                    {"uploaded_bytes", r.uploaded_bytes},
                    {"uploaded_objects", r.uploaded_objects},
                    {"committed", r.committed},
                    {"pending", r.pending},
                    {"already_published", r.already_published},
                    {"index", ref(r.index)},
                    {"seconds",
                     {{"encode", r.encode_seconds},
                      {"hash", r.hash_seconds},
                      {"upload", r.upload_seconds},
                      {"commit", r.commit_seconds},
                      {"total", r.total_seconds}}}};
    std::cout << j.dump(2) << std::endl;
  } else if (!quiet_ && r.already_published) {
    std::printf("publish: step %" PRIu64
                " shard %u/%u (%s): already published, nothing uploaded%s%s; %s\n",
                r.step, r.shard, r.count, r.file.c_str(), r.note.empty() ? "" : " (",
                r.note.empty() ? "" : (r.note + ")").c_str(),
                r.committed ? "step committed" : ("not committed yet: " + r.pending).c_str());
  } else if (!quiet_) {
    std::printf("publish: step %" PRIu64
                " shard %u/%u (%s, %s): delta %s, anchor %s; uploaded %s in %.3f s "
                "(encode %.3f, hash %.3f, upload %.3f, commit %.3f); %s\n",
                r.step, r.shard, r.count, r.file.c_str(), HumanBytes(r.file_bytes).c_str(),
                !r.delta.key.empty() ? HumanBytes(r.delta.bytes).c_str() : "-",
                !r.anchor.key.empty() ? HumanBytes(r.anchor.bytes).c_str() : "-",
                HumanBytes(r.uploaded_bytes).c_str(), r.total_seconds, r.encode_seconds,
                r.hash_seconds, r.upload_seconds, r.commit_seconds,
                r.committed ? "step committed" : ("not committed yet: " + r.pending).c_str());
  }
  return kExitOk;
}

int SyncCommands::RunPull(PullFilesOptions pull) {
  pull.step = step_;
  pull.reset = reset_;
  PullFilesResult r;
  const Status s = PullFiles(store_, dir_, pull, &r);
  if (!s.ok()) return Fail(Name(), json_, s);
  if (json_) {
    std::cout << PullJson(r).dump(2) << std::endl;
  } else if (!quiet_) {
    PrintPull(r);
  }
  return kExitOk;
}

int SyncCommands::RunFollow(const PullFilesOptions& pull) {
  if (trusted_keys_.empty()) {
    std::fprintf(
        stderr,
        "arc_v3 follow: steps are not authenticated (no --trusted-keys): whoever can write to %s "
        "chooses what %s holds\n",
        store_.c_str(), dir_.c_str());
  }
  FollowOptions follow;
  follow.interval_seconds = interval_;
  follow.until = until_;
  follow.max_failures = max_failures_;
  follow.events_listen = events_;
  const Status s =
      FollowFiles(store_, dir_, pull, follow, [&](const FollowEvent& e, const PullFilesResult* r) {
        if (e.kind == FollowEvent::Kind::kWaiting) {
          std::fprintf(stderr, "arc_v3 follow: waiting: %s\n", e.message.c_str());
        } else if (e.kind == FollowEvent::Kind::kRefused) {
          std::fprintf(stderr,
                       "arc_v3 follow: refused step %" PRIu64
                       " (%s keeps what it holds; watching for a step that "
                       "verifies): %s\n",
                       e.step, dir_.c_str(), e.message.c_str());
          if (json_) {
            std::cout << Json{{"command", "follow"},
                              {"refused_step", e.step},
                              {"error", "untrusted"},
                              {"exit_code", kExitUntrusted},
                              {"message", e.message}}
                             .dump()
                      << std::endl;
          }
        } else if (e.kind == FollowEvent::Kind::kRetrying) {
          std::fprintf(stderr, "arc_v3 follow: retrying (%d of %d): %s\n", e.failures,
                       max_failures_, e.message.c_str());
        } else if (json_) {
          Json j = PullJson(*r);
          j["command"] = "follow";
          j["steps_behind"] = e.steps_behind;
          j["lag_seconds"] = e.lag_seconds;
          std::cout << j.dump() << std::endl;
        } else if (!quiet_) {
          std::printf("follow: step %" PRIu64 " (%" PRIu64
                      " behind before), lag %.3f s since published, "
                      "fetched %s by %s in %.3f s\n",
                      e.step, e.steps_behind, e.lag_seconds, HumanBytes(r->fetched_bytes).c_str(),
                      r->route.c_str(), r->total_seconds);
          if (!r->rerouted.empty()) std::printf("follow: rerouted: %s\n", r->rerouted.c_str());
          std::fflush(stdout);
        }
        return true;
      });
  if (!s.ok()) return Fail(Name(), json_, s);
  return kExitOk;
}

int SyncCommands::RunMirror() {
  if (follow_loop_ && step_ != kLatestStep) {
    std::fprintf(stderr,
                 "arc_v3 mirror: --step is for a single copy; with --follow, use --until\n");
    return kExitUsage;
  }
  if (!follow_loop_ && !events_.empty()) {
    std::fprintf(stderr, "arc_v3 mirror: --events wakes a --follow loop; give --follow too\n");
    return kExitUsage;
  }
  MirrorOptions o;
  o.trusted_keys = trusted_keys_;
  o.work_dir = work_dir_;
  o.parallel = parallel_;
  o.store = Settings();
  if (trusted_keys_.empty()) {
    std::fprintf(
        stderr,
        "arc_v3 mirror: steps are not authenticated (no --trusted-keys): the mirror checks "
        "their hashes, and hosts of %s check what they pull as from %s\n",
        dst_.c_str(), store_.c_str());
  }
  if (!follow_loop_) {
    o.step = step_;
    MirrorResult r;
    const Status s = MirrorSteps(store_, dst_, o, &r);
    if (!s.ok()) return Fail(Name(), json_, s);
    if (json_) {
      std::cout << MirrorJson(r).dump(2) << std::endl;
    } else if (!quiet_) {
      PrintMirror("mirror", r, dst_);
    }
    return kExitOk;
  }
  FollowOptions follow;
  follow.interval_seconds = interval_;
  follow.until = until_;
  follow.max_failures = max_failures_;
  follow.events_listen = events_;
  const auto note = [&](const FollowEvent& e, const MirrorResult* r) {
    if (e.kind == FollowEvent::Kind::kWaiting) {
      std::fprintf(stderr, "arc_v3 mirror: waiting: %s\n", e.message.c_str());
    } else if (e.kind == FollowEvent::Kind::kRefused) {
      std::fprintf(stderr, "arc_v3 mirror: refused step %" PRIu64 " (%s keeps what it holds): %s\n",
                   e.step, dst_.c_str(), e.message.c_str());
    } else if (e.kind == FollowEvent::Kind::kRetrying) {
      std::fprintf(stderr, "arc_v3 mirror: retrying (%d of %d): %s\n", e.failures, max_failures_,
                   e.message.c_str());
    } else if (json_) {
      Json j = MirrorJson(*r);
      j["lag_seconds"] = e.lag_seconds;
      std::cout << j.dump() << std::endl;
    } else if (!quiet_) {
      PrintMirror("mirror", *r, dst_);
    }
    return true;
  };
  const Status s = FollowMirror(store_, dst_, o, follow, note);
  if (!s.ok()) return Fail(Name(), json_, s);
  return kExitOk;
}

int SyncCommands::RunVerify() {
  std::vector<StepVerdict> verdicts;
  const Status s = VerifySteps(store_, Settings(), trusted_keys_, &verdicts);
  if (!s.ok()) return Fail(Name(), json_, s);
  bool all = true;
  Json list = Json::array();
  for (const StepVerdict& v : verdicts) {
    all = all && v.status.ok();
    if (json_) {
      list.push_back({{"step", v.step},
                      {"verified", v.status.ok()},
                      {"key_id", v.status.ok() ? Json(v.keyid) : Json(nullptr)},
                      {"error", v.status.ok() ? Json(nullptr) : Json(ErrorName(v.status.code()))},
                      {"message", v.status.ok() ? Json(nullptr) : Json(v.status.message())}});
    } else if (!quiet_) {
      if (v.status.ok()) {
        std::printf("%12" PRIu64 " verified (key %s)\n", v.step, v.keyid.c_str());
      } else {
        std::printf("%12" PRIu64 " NOT verified: %s\n", v.step, v.status.ToString().c_str());
      }
    }
  }
  if (json_) std::cout << list.dump(2) << std::endl;
  return all ? kExitOk : ExitCodeFor(Status(ErrorCode::kUntrusted, ""));
}

int SyncCommands::RunLog() {
  std::vector<StepInfo> steps;
  const Status s = ListSteps(store_, Settings(), json_, &steps);
  if (!s.ok()) return Fail(Name(), json_, s);
  Json all = Json::array();
  if (!json_ && !quiet_) {
    std::printf("%12s %12s %7s %9s %6s %12s %12s %10s\n", "step", "base", "anchor", "committed",
                "shards", "delta", "anchor", "objects");
  }
  const auto bytes_or_null = [](uint64_t bytes) {
    return bytes != 0 ? Json(bytes) : Json(nullptr);
  };
  for (const StepInfo& l : steps) {
    Json shards = Json::array();
    for (const StepShardInfo& r : l.shards) {
      shards.push_back({{"shard", r.shard},
                        {"file", r.file},
                        {"file_bytes", r.file_bytes},
                        {"delta_bytes", bytes_or_null(r.delta_bytes)},
                        {"anchor_bytes", bytes_or_null(r.anchor_bytes)}});
    }
    if (json_) {
      all.push_back({{"step", l.step},
                     {"committed", l.committed},
                     {"base_step",
                      !l.committed || l.base_step == kNoStep ? Json(nullptr) : Json(l.base_step)},
                     {"anchor_step", l.committed ? Json(l.anchor_step) : Json(nullptr)},
                     {"incarnation", l.committed ? Json(l.incarnation) : Json(nullptr)},
                     {"run", l.committed ? Json(Hex16(l.run)) : Json(nullptr)},
                     {"objects", l.objects},
                     {"bytes", l.bytes},
                     {"shards", shards},
                     {"published_at", l.committed ? Json(l.published_at) : Json(nullptr)},
                     {"committed_at", l.committed ? Json(l.committed_at) : Json(nullptr)}});
    } else if (!quiet_) {
      const std::string base =
          l.committed && l.base_step != kNoStep ? std::to_string(l.base_step) : "-";
      std::printf("%12" PRIu64 " %12s %7s %9s %6s %12s %12s %10" PRIu64 "\n", l.step, base.c_str(),
                  l.committed && l.anchor ? "yes" : "", l.committed ? "yes" : "no",
                  l.committed ? std::to_string(l.count).c_str() : "?",
                  l.committed ? HumanBytes(l.delta_bytes).c_str() : "-",
                  l.committed && l.anchor_bytes ? HumanBytes(l.anchor_bytes).c_str() : "-",
                  l.objects);
    }
  }
  if (json_) std::cout << all.dump(2) << std::endl;
  return kExitOk;
}

int SyncCommands::RunPrune() {
  PruneResult r;
  // DURATION: a number of seconds, or of minutes, hours or days with m, h or d after it.
  double min_age = -1;
  {
    char* end = nullptr;
    const double value = std::strtod(min_age_.c_str(), &end);
    const std::string unit = end != nullptr ? end : "";
    const double scale = unit.empty() || unit == "s" ? 1
                         : unit == "m"               ? 60
                         : unit == "h"               ? 3600
                         : unit == "d"               ? 86400
                                                     : -1;
    if (end != min_age_.c_str() && value >= 0 && scale > 0) min_age = value * scale;
  }
  if (min_age < 0) {
    std::fprintf(stderr,
                 "arc_v3 prune: --min-age wants a duration like 90s, 15m, 2h or 1d, got '%s'\n",
                 min_age_.c_str());
    return kExitUsage;
  }
  const Status s = PruneSteps(store_, Settings(), keep_anchors_, dry_run_, min_age, &r);
  if (!s.ok()) return Fail(Name(), json_, s);
  if (json_) {
    const Json j = {{"command", "prune"},
                    {"ok", true},
                    {"dry_run", dry_run_},
                    {"min_age_seconds", min_age},
                    {"keep_from", r.keep_from == kNoStep ? Json(nullptr) : Json(r.keep_from)},
                    {"deleted_steps", r.deleted_steps},
                    {"deleted_objects", r.deleted_objects},
                    {"deleted_bytes", r.deleted_bytes}};
    std::cout << j.dump(2) << std::endl;
  } else if (!quiet_) {
    if (r.keep_from == kNoStep) {
      std::printf("prune: nothing to delete (fewer than the anchors to keep)\n");
    } else {
      std::printf("prune: %s %zu steps before step %" PRIu64 " (%" PRIu64 " objects, %s)\n",
                  dry_run_ ? "would delete" : "deleted", r.deleted_steps.size(), r.keep_from,
                  r.deleted_objects, HumanBytes(r.deleted_bytes).c_str());
    }
  }
  return kExitOk;
}

}  // namespace arc_v3

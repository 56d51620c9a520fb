// Pulling a step into a region's directory (see sync.h): plan the cheapest verified
// route, fetch what it needs, rebuild the files in a stage beside DIR, then commit them
// all at once through a journal.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "src/common/clock.h"
#include "src/common/file_io.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/strict_json.h"
#include "src/sync/apply_hop.h"
#include "src/sync/dir_state.h"
#include "src/sync/route.h"
#include "src/sync/pull_apply.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {
namespace {

// What a partial pull fetches ahead, in all: the rest of its pieces are read as they are
// decoded, so that its memory does not grow with the checkpoint.
constexpr uint64_t kPrefetchBudget = uint64_t{64} << 20;

namespace fs = std::filesystem;
using checkpoint::Group;

// Checks DIR's files against its state (cheaply, by size and time; by contents where
// those changed). Refreshes the recorded times of files whose contents still match.
Status CheckDirectory(const std::string& dir, DirState* state) {
  bool retimed_any = false;
  for (ShardState& shard : state->shards) {
    for (FileRecord* f : {&shard.file, &shard.rows}) {
      if (f->path.empty()) continue;
      bool retimed = false;
      Status s = CheckFile(dir, f, &retimed);
      if (!s.ok()) {
        return Status(s.code(),
                      s.message() + " (it records step " + std::to_string(state->step) + ")");
      }
      retimed_any = retimed_any || retimed;
    }
  }
  return retimed_any ? WriteState(dir, *state) : Status::Ok();
}

// Trust stays on once a pull took it: a pull without keys would take anyone's steps.
Status KeptTrust(const std::string& dir, const DirState& state, bool trusting) {
  if (trusting || state.trusted_keys.empty()) return Status::Ok();
  const size_t more = state.trusted_keys.size() - 1;
  return Status(
      ErrorCode::kUntrusted,
      dir + " was pulled trusting key " + state.trusted_keys[0].substr(0, 16) +
          (more > 0 ? " and " + std::to_string(more) + " more" : "") +
          ": a pull without trusted keys would take steps signed by anyone or no one (trust the "
          "keys again, or reset the directory to pull it without trust)");
}

// Which route a retry must not take: DIR's chain (its objects vanished or are damaged, or
// DIR's rows do not suffice) or the anchor's (its objects are damaged).
enum class Avoid { kNone, kDir, kAnchor };
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid,
                  PullReport* report);

// The layouts a partial pull read stay in DIR/.arc_v3/layouts/XXH3.json for the next pull
// (a run's layout rarely changes, so a host pays for them once): a file is used only if its
// bytes hash to its name, and under trust only if its SHA-256 is the one the root names
// (LoadShards). Best effort: a cache that cannot be read or written is skipped.
void LoadLayoutCache(const std::string& dir, LayoutCache* layouts) {
  std::error_code ec;
  std::vector<fs::path> damaged;
  for (auto it = fs::directory_iterator(fs::path(dir) / kStateDir / "layouts", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 21 || name.compare(16, 5, ".json") != 0) continue;
    std::ifstream in(it->path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    const uint64_t xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
    Layout layout;
    if (checkpoint::HexU64(xxh3) == name.substr(0, 16) &&
        ParseLayout(bytes, it->path().string(), &layout).ok()) {
      layout.sha256 =
          DigestHex(Sha256(bytes.data(), bytes.size()));  // what a trusting pull compares
      (*layouts)[xxh3] = std::move(layout);
    } else {
      damaged.push_back(it->path());  // fetched again, and rewritten
    }
  }
  for (const fs::path& path : damaged) fs::remove(path, ec);
}

void SaveLayoutCache(const std::string& dir, const LayoutCache& layouts, const StepManifest& step) {
  std::error_code ec;
  const fs::path folder = fs::path(dir) / kStateDir / "layouts";
  fs::create_directories(folder, ec);
  std::set<std::string> keep;
  for (const StepManifest::Group& g : step.groups) {
    const auto it = layouts.find(g.layout_xxh3);
    if (it == layouts.end()) continue;
    const std::string name = checkpoint::HexU64(g.layout_xxh3) + ".json";
    keep.insert(name);
    const std::string json = LayoutJson(it->second);
    if (checkpoint::Hash(json.data(), json.size()) != g.layout_xxh3) continue;
    // A file of other bytes (of the same XXH3) is replaced by the layout the root names.
    std::ifstream in(folder / name, std::ios::binary);
    if (in &&
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) == json)
      continue;
    const fs::path tmp = folder / ("." + name + ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(json.data(), static_cast<std::streamsize>(json.size()));
    }
    fs::rename(tmp, folder / name, ec);
  }
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (keep.count(it->path().filename().string()) == 0) fs::remove(it->path(), ec);
  }
}

// Pulls again by an anchor route; the report counts that pull alone.
Status Retry(Store* store, const std::string& dir, const PullOptions& o, PullReport* report) {
  *report = PullReport();
  return PullLocked(store, dir, o, Avoid::kDir, report);
}

// A route met a damaged object or document: the pull takes the other route, if there is
// one, and says so; else it fails with what it met.
Status Reroute(Store* store, const std::string& dir, const PullOptions& o, const Route& route,
               const Status& met, PullReport* report) {
  PullReport other;
  const Status s = PullLocked(store, dir, o, route.from_dir ? Avoid::kDir : Avoid::kAnchor, &other);
  if (!s.ok()) return NoOtherRoute(met, route.name, s);
  *report = std::move(other);
  report->rerouted = ReroutedNote(met, report->route, route.name);
  return s;
}

// A pull that failed on `route` (`s`): pulled once more another way where the rules allow
// (PROTOCOL.md, Pulling, "Route"), else `s` as it is. A chain route from DIR whose pieces
// vanished (not_found), or, applying, whose rows do not suffice (`rows_may_lack`), is
// pulled again by an anchor route; a route that met damage takes the other route. A retry
// (`retried`) is never retried.
Status Recover(Store* store, const std::string& dir, const PullOptions& o, const Route& route,
               bool retried, bool rows_may_lack, const Status& s, PullReport* report) {
  if (s.ok() || retried) return s;
  const bool lacks = rows_may_lack && s.code() == ErrorCode::kChecksumMismatch;
  if (route.from_dir && (s.code() == ErrorCode::kNotFound || lacks))
    return Retry(store, dir, o, report);
  if (Damaged(s.code()) && !route.hops.empty()) return Reroute(store, dir, o, route, s, report);
  return s;
}

// A pull's selection of tensors and rows, compiled from its options.
Status CompileSelect(const PullOptions& o, Select* select) {
  select->sel.tensors = o.tensors;
  select->sel.row_begin = o.row_begin;
  select->sel.row_end = o.row_end;
  if (!select->sel.partial() && (o.row_begin != 0 || o.row_end != UINT64_MAX))
    select->sel.tensors = ".*";
  try {
    select->pattern =
        std::regex(select->sel.partial() ? select->sel.tensors : ".*", std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(ErrorCode::kInvalidArgument, "tensor pattern '" + select->sel.tensors +
                                                   "' is not a regular expression: " + e.what());
  }
  if (o.row_begin > o.row_end) {
    return Status(ErrorCode::kInvalidArgument, "rows " + std::to_string(o.row_begin) + ":" +
                                                   std::to_string(o.row_end) + " are reversed");
  }
  return Status::Ok();
}

// What a pull settled before it fetches: what DIR holds, and the route from it.
struct PullPlan {
  Select select;
  DirState state;
  bool have_state = false;
  Route route;
  LayoutCache layouts;  // of a partial pull
  Trust trust;
  Clock::time_point start;  // of the pull
};

// DIR's state, after a commit a crash interrupted is finished (a reset drops one it cannot
// finish); none (have_state false) in a directory never pulled into or under a reset.
Status ReadDirState(const std::string& dir, const PullOptions& o, PullPlan* plan,
                    PullReport* report) {
  Status s = RecoverJournal(dir);
  if (!s.ok() && o.reset) s = DropJournal(dir);
  if (!s.ok()) return s;
  s = ReadState(dir, &plan->state);
  if (s.ok()) {
    plan->have_state = true;
    report->from_step = plan->state.step;
  } else if (s.code() != ErrorCode::kNotFound && !o.reset) {
    return s;
  }
  return Status::Ok();
}

// One entry per (hop, shard) of the route, downloaded into the stage; `object_of`:
// [hop][shard] -> index in `fetched`.
void ListObjects(const Route& route, const Stage& stage, bool partial,
                 std::vector<Fetched>* fetched, std::vector<std::vector<size_t>>* object_of) {
  object_of->assign(route.hops.size(), {});
  for (size_t h = 0; h < route.hops.size(); ++h) {
    for (size_t k = 0; k < route.hops[h].m.count; ++k) {
      (*object_of)[h].push_back(fetched->size());
      fetched->emplace_back();
      Fetched& f = fetched->back();
      f.hop = h;
      f.shard = k;
      f.ref = RefOf(route.hops[h], k);
      f.record = &route.hops[h].m.shards[k];
      f.path = stage.Path("objects/" + std::to_string(fetched->size() - 1) + ".a3d");
      // A shard none of whose records on the route names a selected tensor needs no byte
      // of its objects (nor do its small tensors: a group is kept whole only for a selected
      // member): a pull of a few shards' tensors reads only those shards' records and objects.
      if (partial) f.skipped = !route.touched[k];
    }
  }
}

// Fetches, applies and verifies the planned route in a stage, then commits it to DIR.
Status TakeRoute(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid,
                 PullPlan* plan, PullReport* report) {
  const bool avoid_dir = avoid != Avoid::kNone;  // a retry does not retry again
  const bool partial = plan->select.sel.partial();
  const Route& route = plan->route;
  Stage stage;
  ARC_V3_RETURN_IF_ERROR(stage.Create(dir));
  StagedRoute staged;
  staged.route = &route;
  staged.select = &plan->select;
  staged.stage = &stage;
  ListObjects(route, stage, partial, &staged.fetched, &staged.object_of);
  const Trust& trust = plan->trust;  // under it, what fails a check is kUntrusted: never rerouted
  std::vector<std::string>& current = staged.current;
  current.resize(route.hops.back().m.count);
  for (size_t k = 0; route.from_dir && k < current.size(); ++k) {
    const ShardState& shard = plan->state.shards[k];
    current[k] = (fs::path(dir) / (partial ? shard.rows.path : shard.name)).string();
  }
  // A full pull decodes each object as it arrives; what fetching met is still judged
  // first, as if every object had been fetched before the first was applied.
  Status s, applied;
  if (partial) {
    s = FetchPieces(store, o.transfer_options(), UINT64_MAX, &plan->select, &staged.fetched, report,
                    kPrefetchBudget, trust);
  } else {
    ObjectFeed feed(store, o, trust, &staged.fetched, report);
    s = feed.Start();
    if (s.ok()) {
      applied = ApplyRoute(&staged, &feed, o, report);
      s = feed.Finish();
    }
  }
  s = UnderTrust(trust, s);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("fetched"));

  if (partial) applied = ApplyRoute(&staged, nullptr, o, report);
  s = UnderTrust(trust, applied);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, partial, s, report);
  if (!partial) {
    const auto verify = Clock::now();
    s = UnderTrust(trust, VerifyResults(&plan->route.hops.back(), staged.fetched,
                                        staged.object_of.back(), current));
    report->verify_seconds += SecondsSince(verify);
    if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  }

  Journal journal;
  ARC_V3_RETURN_IF_ERROR(BuildJournal(store, dir, plan->have_state ? &plan->state : nullptr, staged,
                                      trust, &journal, report));
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("commit"));
  const auto commit = Clock::now();
  stage.HandOver();
  ARC_V3_RETURN_IF_ERROR(Commit(dir, journal, o.after_move));
  if (partial) SaveLayoutCache(dir, plan->layouts, route.hops.back().m);
  report->commit_seconds = SecondsSince(commit);
  report->total_seconds = SecondsSince(plan->start);
  return Status::Ok();
}

// `avoid`: kDir routes from an anchor even where DIR's step is on the chain (a retry after
// the chain's objects vanished, pruned, while this pull planned, were damaged, or after
// DIR's rows did not suffice for a partial pull's new selection of groups); kAnchor takes
// DIR's chain even where the anchor costs less (its objects were damaged).
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid,
                  PullReport* report) {
  const bool avoid_dir = avoid != Avoid::kNone;  // a retry does not retry again
  PullPlan plan;
  plan.start = Clock::now();
  ARC_V3_RETURN_IF_ERROR(CompileSelect(o, &plan.select));
  const bool partial = plan.select.sel.partial();
  ARC_V3_RETURN_IF_ERROR(ReadDirState(dir, o, &plan, report));
  const DirState& state = plan.state;
  const bool have_state = plan.have_state && !o.reset;

  ARC_V3_RETURN_IF_ERROR(LoadTrust(o.trusted_keys, &plan.trust));
  if (have_state) ARC_V3_RETURN_IF_ERROR(KeptTrust(dir, state, plan.trust.on()));
  // Under trust DIR's files are a base only if a trusting pull wrote them: the chain from
  // them then links by SHA-256 (PlanRoute); else the pull goes by an anchor.
  const bool dir_verified =
      !plan.trust.on() || (!state.trusted_keys.empty() && !state.root_sha256.empty());
  Hop target;
  ARC_V3_RETURN_IF_ERROR(ReadTarget(store, o.step, &target, report, plan.trust));
  if (have_state) {
    // A signed step is still refused where it would take DIR back, or to another run.
    ARC_V3_RETURN_IF_ERROR(CheckProgress(plan.trust, state.step, state.run, target.m, dir));
    // DIR's own files must be what it records before anything is applied onto them.
    const auto verify = Clock::now();
    const Status s = CheckDirectory(dir, &plan.state);
    report->verify_seconds += SecondsSince(verify);
    ARC_V3_RETURN_IF_ERROR(s);
    if (state.step == target.m.step && state.manifest_xxh3 == target.manifest_xxh3 &&
        dir_verified && (!plan.trust.on() || state.root_sha256 == target.root_sha256) &&
        state.selection == plan.select.sel) {
      report->up_to_date = true;
      report->route = "up to date";
      for (const ShardState& sh : state.shards) report->checkpoint_bytes += sh.file.size;
      report->total_seconds = SecondsSince(plan.start);
      return Status::Ok();
    }
  }
  Route& route = plan.route;
  const bool usable =
      have_state && dir_verified && state.selection == plan.select.sel && avoid != Avoid::kDir;
  RouteFrom from{state.step, state.manifest_xxh3, state.root_sha256,
                 static_cast<uint32_t>(state.shards.size()), state.incarnation};
  from.only_chain = avoid == Avoid::kAnchor;
  if (from.only_chain && !usable)
    return Status(ErrorCode::kNotFound, "the directory holds no step on the chain");
  Status s =
      PlanRoute(store, usable ? &from : nullptr, std::move(target), &route, report, plan.trust);
  if (partial) LoadLayoutCache(dir, &plan.layouts);
  if (s.ok())
    s = LoadRoute(store, partial ? &plan.select : nullptr, &plan.layouts, &route, report,
                  plan.trust);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  report->route = route.name;
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("planned"));
  return TakeRoute(store, dir, o, avoid, &plan, report);
}

}  // namespace

Status Pull(Store* store, const std::string& dir, const PullOptions& options, PullReport* report) {
  *report = PullReport();
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  const bool had_state_dir = fs::exists(fs::path(dir) / kStateDir, ec);
  if (existed && !fs::is_directory(dir, ec)) {
    return Status(ErrorCode::kInvalidArgument, dir + " is not a directory");
  }
  // A directory of other files is not a region's: pulling would replace files of the same
  // names. It is taken only when asked to.
  if (existed && !had_state_dir && !options.force && !options.reset &&
      fs::directory_iterator(dir, ec) != fs::directory_iterator()) {
    return Status(
        ErrorCode::kAlreadyExists,
        dir + " holds files but was never pulled into: they are not replaced unless forced");
  }
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    return Status(ErrorCode::kInvalidArgument, dir + ": cannot create the directory");
  DirLock lock;
  ARC_V3_RETURN_IF_ERROR(lock.Acquire(dir));  // another pull's: never clean up under it
  Status s =
      PullLocked(store, dir, options, options.anchor_route ? Avoid::kDir : Avoid::kNone, report);
  // A first pull that failed leaves nothing behind: not the directory it made, nor the
  // lock and stage it made inside one that existed (removed while the lock is held).
  const fs::path state_dir = fs::path(dir) / kStateDir;
  if (!s.ok() && !had_state_dir && !fs::exists(state_dir / "state.json", ec) &&
      !fs::exists(state_dir / "commit.json", ec)) {
    fs::remove_all(existed ? state_dir : fs::path(dir), ec);
  }
  return s;
}

Status CheckTrustKept(const std::string& dir, const PullOptions& options) {
  DirState state;
  if (options.reset || !options.trusted_keys.empty() || !ReadState(dir, &state).ok())
    return Status::Ok();
  return KeptTrust(dir, state, false);
}

Status DirectoryStep(const std::string& dir, uint64_t* step) {
  DirState state;
  Status s = ReadState(dir, &state);
  if (s.ok()) *step = state.step;
  return s;
}

}  // namespace sync
}  // namespace arc_v3

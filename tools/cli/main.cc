// arc_v3: the command-line tool for checkpoint deltas. A trainer runs `diff` once per
// step; every receiver runs `apply` (or a partial apply of the tensors it serves).
// Argument parsing is CLI11, JSON output nlohmann::json; all the work is in
// the library (arc_v3_checkpoint.hpp, arc_v3_sync.hpp).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "arc_v3.hpp"
#include "arc_v3_checkpoint.hpp"
#include "tools/cli/cli_common.h"
#include "tools/cli/sync_commands.h"

namespace arc_v3 {
namespace {

using Json = nlohmann::ordered_json;

// A progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  Progress(bool enabled, const char* label) : enabled_(enabled && isatty(2)), label_(label) {
    if (enabled_) thread_ = std::thread([this] { Run(); });
  }
  ~Progress() { Stop(); }
  void Stop() {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    enabled_ = false;
    std::fprintf(stderr, "\r\033[K");
  }
  std::atomic<uint64_t> done{0}, total{0};

 private:
  void Run() {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) {
      const uint64_t d = done, t = total;
      if (t == 0) continue;
      const double frac = std::min(1.0, static_cast<double>(d) / t);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int width = 30, filled = static_cast<int>(frac * width);
      std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %s/s\033[K", label_,
                   std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(),
                   100 * frac, HumanBytes(secs > 0 ? d / secs : 0).c_str());
      std::fflush(stderr);
    }
  }
  bool enabled_;
  const char* label_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

struct Common {
  int threads = 0;
  int effort = kDefaultEffort;
  bool json = false;
  bool quiet = false;
  bool no_sync = false;
  bool no_group = false;
  bool force = false;
};

void AddCommon(CLI::App* cmd, Common* c) {
  cmd->add_option("-T,--threads", c->threads, "Worker threads (default 0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", c->json, "Print a JSON summary on stdout instead of text");
  cmd->add_flag("-q,--quiet", c->quiet, "No progress bar and no text summary");
}

CheckpointOptions MakeOptions(const Common& c, Progress* progress) {
  CheckpointOptions o;
  o.threads = c.threads;
  o.effort = c.effort;
  o.sync = !c.no_sync;
  o.group = !c.no_group;
  o.overwrite = c.force;
  o.progress_done = &progress->done;
  o.progress_total = &progress->total;
  return o;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Report(const char* command, const Common& c, const Status& s, const CheckpointReport& r,
           double secs) {
  if (!s.ok()) {
    PrintError(command, s);
    if (c.json) {
      Json j = {{"command", command},
                {"ok", false},
                {"error", ErrorName(s.code())},
                {"message", s.message()},
                {"exit_code", ExitCodeFor(s)}};
      if (!HintFor(command, s).empty()) j["hint"] = HintFor(command, s);
      std::cout << j.dump(2) << "\n";
    }
    return ExitCodeFor(s);
  }
  if (c.json) {
    Json j = {{"command", command},
              {"ok", true},
              {"files", r.files},
              {"tensors", r.tensors},
              {"pieces", r.pieces},
              {"checkpoint_bytes", r.target_bytes},
              {"delta_bytes", r.delta_bytes},
              {"seconds", secs},
              {"checkpoint_gb_per_s", secs > 0 ? r.target_bytes / secs / 1e9 : 0.0},
              {"written", r.written}};
    std::cout << j.dump(2) << "\n";
  } else if (!c.quiet && std::strcmp(command, "apply (partial)") == 0) {
    // The output holds some tensors or rows: the delta is not a share of it.
    std::printf("%s: %" PRIu64 " tensors, %s written, read from a delta of %s, %.2f s\n", command,
                r.tensors, HumanBytes(r.target_bytes).c_str(), HumanBytes(r.delta_bytes).c_str(),
                secs);
  } else if (!c.quiet) {
    std::printf("%s: %" PRIu64 " file(s), %" PRIu64
                " tensors, checkpoint %s, delta %s (%.3f%%), "
                "%.2f s, %.2f GB/s\n",
                command, r.files, r.tensors, HumanBytes(r.target_bytes).c_str(),
                HumanBytes(r.delta_bytes).c_str(),
                r.target_bytes ? 100.0 * r.delta_bytes / r.target_bytes : 0.0, secs,
                secs > 0 ? r.target_bytes / secs / 1e9 : 0.0);
  }
  return kExitOk;
}

// Per-tensor statistics for `inspect`.
Json ChunksJson(const ArcV3Chunks& c) {
  return {{"unchanged", c.unchanged},
          {"xor_streams", c.xor_streams},
          {"modelled", c.modelled},
          {"rans", c.rans},
          {"rans_history", c.rans_history}};
}

// What inspect adds up over the tensors and groups.
struct InspectTotals {
  uint64_t bytes = 0, stored = 0, elements = 0, changed = 0;
  bool all_known = true;
  std::map<std::string, uint64_t> kinds;
};

Json TensorJson(const DeltaTensorInfo& t) {
  const std::set<std::string> coders(t.coders.begin(), t.coders.end());
  Json jt = {{"name", t.name},     {"dtype", t.dtype}, {"shape", t.shape}, {"kind", t.kind},
             {"pieces", t.pieces}, {"coders", coders}, {"bytes", t.bytes}};
  // A grouped tensor's delta bytes are its group's, listed under "groups".
  if (t.group >= 0) {
    jt["group"] = t.group;
  } else {
    jt["delta_bytes"] = t.delta_bytes;
  }
  if (t.chunks_known && t.group < 0) jt["arc_v3_chunks"] = ChunksJson(t.chunks);
  if (t.changes_known) {
    jt["changed"] = t.changed;
    jt["density"] = t.elements ? static_cast<double>(t.changed) / t.elements : 0;
    if (t.chunks_known)
      jt["exponent_or_sign_share"] = t.changed ? static_cast<double>(t.high) / t.changed : 0;
  }
  return jt;
}

void PrintTensorRow(const DeltaTensorInfo& t) {
  std::string shape = "[";
  for (size_t d = 0; d < t.shape.size(); ++d) shape += (d ? "," : "") + std::to_string(t.shape[d]);
  shape += "]";
  char dens[16] = "-", hi[16] = "-";
  if (t.kind == "delta" && !t.changes_known) std::snprintf(dens, sizeof(dens), "?");
  if (t.changes_known) {
    std::snprintf(dens, sizeof(dens), "%.3f%%", t.elements ? 100.0 * t.changed / t.elements : 0.0);
    if (t.chunks_known)
      std::snprintf(hi, sizeof(hi), "%.2f%%", t.changed ? 100.0 * t.high / t.changed : 0.0);
  }
  char stored[32], share[16] = "-";
  if (t.group >= 0) {
    std::snprintf(stored, sizeof(stored), "group %" PRId64, t.group);
  } else {
    std::snprintf(stored, sizeof(stored), "%" PRIu64, t.delta_bytes);
    std::snprintf(share, sizeof(share), "%.3f%%", t.bytes ? 100.0 * t.delta_bytes / t.bytes : 0.0);
  }
  std::printf("%-44s %-6s %-16s %-8s %8s %9s %-22s %12s %8s\n", t.name.c_str(), t.dtype.c_str(),
              shape.c_str(), t.kind.c_str(), dens, hi, t.coder_summary.c_str(), stored, share);
}

Json GroupJson(size_t i, const DeltaGroupInfo& g) {
  Json jg = {{"group", i},
             {"file", g.file},
             {"tensors", g.tensors},
             {"elements", g.elements},
             {"coders", {g.coder_summary}},
             {"delta_bytes", g.delta_bytes}};
  jg["arc_v3_chunks"] = ChunksJson(g.chunks);
  if (g.changes_known) jg["changed"] = g.changed;
  return jg;
}

void PrintGroupRow(size_t i, const DeltaGroupInfo& g) {
  if (i == 0) {
    std::printf("\n%-7s %-32s %8s %12s %9s %-22s %12s %8s\n", "group", "file", "tensors",
                "elements", "density", "coder", "bytes", "% size");
  }
  char dens[16] = "?";
  if (g.changes_known) {
    std::snprintf(dens, sizeof(dens), "%.3f%%", g.elements ? 100.0 * g.changed / g.elements : 0.0);
  }
  std::printf("%-7zu %-32s %8" PRIu64 " %12" PRIu64 " %9s %-22s %12" PRIu64 " %7.3f%%\n", i,
              g.file.c_str(), g.tensors, g.elements, dens, g.coder_summary.c_str(), g.delta_bytes,
              g.elements ? 100.0 * g.delta_bytes / (2 * g.elements) : 0.0);
}

void PrintInspectTotals(const DeltaInfo& info, const InspectTotals& t) {
  std::printf("\ntotal: %" PRIu64 " file(s), %zu tensors (", info.files, info.tensors.size());
  bool first = true;
  for (const auto& k : t.kinds) {
    std::printf("%s%" PRIu64 " %s", first ? "" : ", ", k.second, k.first.c_str());
    first = false;
  }
  std::printf("), %zu removed\n", info.removed_tensors.size());
  char density[32] = "? (pass --base PREV to count)";
  if (t.all_known) {
    std::snprintf(density, sizeof(density), "%.4f%%",
                  t.elements ? 100.0 * t.changed / t.elements : 0.0);
  }
  std::printf(
      "tensor data %s, density of deltas %s, delta file %s (%.4f%% of tensor data; "
      "manifest %s; container version %u)\n",
      HumanBytes(t.bytes).c_str(), density, HumanBytes(info.delta_bytes).c_str(),
      t.bytes ? 100.0 * info.delta_bytes / t.bytes : 0.0, HumanBytes(info.manifest_bytes).c_str(),
      static_cast<unsigned>(info.container_version));
  for (const auto& name : info.removed_files) std::printf("removed file: %s\n", name.c_str());
  for (const auto& name : info.removed_tensors) std::printf("removed tensor: %s\n", name.c_str());
}

int Inspect(const std::string& path, const std::string& base_path, const Common& c) {
  DeltaInfo info;
  const Status s = InspectDeltaFile(path, base_path, c.threads, &info);
  if (!s.ok()) {
    std::fprintf(stderr, "arc_v3 inspect: error: %s\n", s.ToString().c_str());
    return ExitCodeFor(s);
  }
  InspectTotals totals;
  Json jtensors = Json::array(), jgroups = Json::array();
  if (!c.json) {
    std::printf("%-44s %-6s %-16s %-8s %8s %9s %-22s %12s %8s\n", "tensor", "dtype", "shape",
                "kind", "density", "exp/sign", "coder", "bytes", "% size");
  }
  for (const DeltaTensorInfo& t : info.tensors) {
    totals.bytes += t.bytes;
    totals.stored += t.delta_bytes;
    totals.elements += t.elements;
    totals.changed += t.changes_known ? t.changed : 0;
    totals.all_known = totals.all_known && (t.kind != "delta" || t.changes_known);
    ++totals.kinds[t.kind];
    if (c.json) {
      jtensors.push_back(TensorJson(t));
    } else {
      PrintTensorRow(t);
    }
  }
  for (size_t i = 0; i < info.groups.size(); ++i) {
    totals.stored += info.groups[i].delta_bytes;
    if (c.json) {
      jgroups.push_back(GroupJson(i, info.groups[i]));
    } else {
      PrintGroupRow(i, info.groups[i]);
    }
  }
  if (!c.json) {
    PrintInspectTotals(info, totals);
    return kExitOk;
  }
  Json j = {{"command", "inspect"},
            {"ok", true},
            {"layout", info.directory ? "directory" : "file"},
            {"files", info.files},
            {"tensors", jtensors},
            {"groups", jgroups},
            {"tensor_bytes", totals.bytes},
            {"tensor_delta_bytes", totals.stored},
            {"delta_file_bytes", info.delta_bytes},
            {"manifest_bytes", info.manifest_bytes},
            {"container_version", info.container_version},
            {"changed", totals.all_known ? Json(totals.changed) : Json(nullptr)},
            {"removed_tensors", info.removed_tensors},
            {"removed_files", info.removed_files}};
  std::cout << j.dump(2) << "\n";
  return kExitOk;
}

// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate nearest to `word` if it is near enough to be a typo of it, else "".
std::string Nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    const bool prefix = word.size() >= 3 && c.compare(0, word.size(), word) == 0;
    if (d < best_distance || (prefix && best.empty())) {
      best = c;
      best_distance = prefix ? 0 : d;
    }
  }
  return best;
}

// Catches a mistyped subcommand or long option before CLI11 does (it would report a
// missing subcommand or a missing required option instead) and suggests the nearest.
// Returns true if it reported one.
bool ReportTypo(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string command = argv[1];
  std::vector<std::string> names;
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(s->get_name());
    if (s->get_name() == command) sub = s;
  }
  if (sub == nullptr) {
    const std::string near = Nearest(command, names);
    std::string all;
    for (const std::string& n : names) all += " " + n;
    std::fprintf(stderr, "arc_v3: '%s' is not a command.%s\nCommands:%s (arc_v3 --help)\n",
                 command.c_str(), near.empty() ? "" : (" Did you mean '" + near + "'?").c_str(),
                 all.c_str());
    return true;
  }
  std::vector<std::string> flags = {"--help"};
  for (const CLI::Option* o : sub->get_options()) {
    for (const std::string& l : o->get_lnames()) flags.push_back("--" + l);
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) continue;
    const std::string near = Nearest(flag, flags);
    std::fprintf(stderr,
                 "arc_v3 %s: unknown option '%s'.%s\nRun 'arc_v3 %s --help' for its options.\n",
                 command.c_str(), flag.c_str(),
                 near.empty() ? "" : (" Did you mean '" + near + "'?").c_str(), command.c_str());
    return true;
  }
  return false;
}

// The checkpoint subcommands (diff, apply, verify, inspect) and their options.
class CheckpointCommands {
 public:
  explicit CheckpointCommands(CLI::App* app) {
    AddDiff(app);
    AddApply(app);
    AddVerify(app);
    AddInspect(app);
  }
  // Runs the chosen subcommand (one of these was parsed); returns the exit code.
  int Run(const char* label);

 private:
  void AddDiff(CLI::App* app);
  void AddApply(CLI::App* app);
  void AddVerify(CLI::App* app);
  void AddInspect(CLI::App* app);
  // apply: whether -o / --in-place and --rows make sense (says why not on stderr); then
  // the apply itself, partial with --tensors / --rows.
  bool ApplyArgsOk();
  Status Apply(Progress* progress, CheckpointReport* report, const char** name);

  Common common_;
  std::string prev_, next_, delta_, out_, tensors_regex_ = ".*", rows_;
  bool in_place_ = false;
  CLI::App *diff_ = nullptr, *apply_ = nullptr, *verify_ = nullptr, *inspect_ = nullptr;
  CLI::Option *tensors_opt_ = nullptr, *rows_opt_ = nullptr;
  uint64_t row_begin_ = 0, row_end_ = UINT64_MAX;
};

void CheckpointCommands::AddDiff(CLI::App* app) {
  diff_ = app->add_subcommand("diff", "Write the delta from checkpoint PREV to NEXT");
  diff_->add_option("PREV", prev_, "Base checkpoint (.safetensors file or directory)")->required();
  diff_->add_option("NEXT", next_, "New checkpoint, same kind as PREV")->required();
  diff_->add_option("-o,--output", delta_, "Delta file to write (e.g. step_101.a3d)")->required();
  AddCommon(diff_, &common_);
  diff_
      ->add_option(
          "-e,--effort", common_.effort,
          "arc_v3 codec effort 0..3 for BF16 tensors (default 2; higher may be smaller and slower)")
      ->check(CLI::Range(0, 3));
  diff_->add_flag("-f,--force", common_.force, "Replace OUTPUT if it exists (refused otherwise)");
  diff_->add_flag("--no-group", common_.no_group,
                  "Give every BF16 tensor its own payloads: a version-1 delta file, which arc_v3 "
                  "tools older than container version 2 can read (small tensors cost more)");
}

void CheckpointCommands::AddApply(CLI::App* app) {
  apply_ = app->add_subcommand("apply",
                               "Rebuild NEXT from PREV and a delta (refuses a wrong PREV, naming "
                               "the tensor; all or nothing)");
  apply_->add_option("PREV", prev_, "Base checkpoint the delta was made from")->required();
  apply_->add_option("DELTA", delta_, "Delta file written by `arc_v3 diff`")->required();
  CLI::Option* out_opt = apply_->add_option(
      "-o,--output", out_,
      "Where NEXT goes: a file (or a directory to put it in) for single-file deltas, a\n"
      "directory (created if needed) for sharded ones. With --tensors/--rows: a new\n"
      ".safetensors file holding just the selected tensors/rows");
  CLI::Option* in_place_opt = apply_->add_flag(
      "--in-place", in_place_, "Replace PREV by NEXT (new files are written aside first)");
  out_opt->excludes(in_place_opt);
  tensors_opt_ = apply_->add_option(
      "--tensors", tensors_regex_,
      "Partial apply: only tensors whose whole name matches this regex (ECMAScript)");
  rows_opt_ = apply_->add_option(
      "--rows", rows_, "Partial apply: only rows A:B of the first dimension (A: or :B allowed)");
  tensors_opt_->excludes(in_place_opt);
  rows_opt_->excludes(in_place_opt);
  apply_->add_flag(
      "-f,--force", common_.force,
      "Replace output files that exist (refused otherwise; --in-place always replaces)");
  AddCommon(apply_, &common_);
  apply_->add_flag("--no-sync", common_.no_sync, "Skip fsync (benchmarks only: not crash-safe)");
}

void CheckpointCommands::AddVerify(CLI::App* app) {
  verify_ = app->add_subcommand(
      "verify", "Check that PREV is the base of DELTA and that DELTA is intact; writes nothing");
  verify_->add_option("PREV", prev_, "Base checkpoint")->required();
  verify_->add_option("DELTA", delta_, "Delta file")->required();
  AddCommon(verify_, &common_);
}

void CheckpointCommands::AddInspect(CLI::App* app) {
  inspect_ = app->add_subcommand(
      "inspect", "Per tensor: dtype, shape, kind, density, exponent/sign share, coder, bytes");
  inspect_->add_option("DELTA", delta_, "Delta file")->required();
  inspect_->add_option("-b,--base", prev_,
                       "Base checkpoint: lets context-modelled chunks be decoded so that their\n"
                       "changes are counted (density is '?' for them otherwise)");
  AddCommon(inspect_, &common_);
}

bool CheckpointCommands::ApplyArgsOk() {
  if (!in_place_ && out_.empty()) {
    std::fprintf(stderr, "arc_v3 apply: give -o OUTPUT or --in-place\n");
    return false;
  }
  if (!rows_.empty() && !ParseRows(rows_, &row_begin_, &row_end_)) {
    std::fprintf(stderr, "arc_v3 apply: --rows wants A:B with A <= B, got '%s'\n", rows_.c_str());
    return false;
  }
  return true;
}

Status CheckpointCommands::Apply(Progress* progress, CheckpointReport* report, const char** name) {
  const bool partial = tensors_opt_->count() > 0 || rows_opt_->count() > 0;
  *name = partial ? "apply (partial)" : "apply";
  if (partial) {
    return ApplyDeltaPart(prev_, delta_, tensors_regex_, row_begin_, row_end_, out_,
                          MakeOptions(common_, progress), report);
  }
  return ApplyDelta(prev_, delta_, in_place_ ? prev_ : out_, MakeOptions(common_, progress),
                    report);
}

int CheckpointCommands::Run(const char* label) {
  if (inspect_->parsed()) return Inspect(delta_, prev_, common_);
  if (apply_->parsed() && !ApplyArgsOk()) return kExitUsage;
  Progress progress(!common_.quiet, label);
  const auto start = std::chrono::steady_clock::now();
  CheckpointReport report;
  Status s;
  const char* name = "";
  if (diff_->parsed()) {
    name = "diff";
    s = DiffCheckpoints(prev_, next_, delta_, MakeOptions(common_, &progress), &report);
  } else if (apply_->parsed()) {
    s = Apply(&progress, &report, &name);
  } else if (verify_->parsed()) {
    name = "verify";
    s = VerifyDelta(prev_, delta_, MakeOptions(common_, &progress), &report);
  }
  const double secs = Seconds(start);
  progress.Stop();
  return Report(name, common_, s, report, secs);
}

constexpr char kAppHelp[] =
    ": lossless deltas between safetensors checkpoints (BF16 weights through the arc_v3\n"
    "codec, every other dtype through XOR + zstd), for shipping RL weight updates.\n\n"
    "  trainer:   arc_v3 diff  step_100/ step_101/ -o step_101.a3d\n"
    "  receiver:  arc_v3 apply step_100/ step_101.a3d -o step_101/     (or --in-place)\n"
    "  partial:   arc_v3 apply step_100/ step_101.a3d --tensors 'layers\\.3\\..*' --rows 0:1024 -o "
    "part.safetensors\n\n"
    "Through an object store (each trainer shard publishes, each region pulls):\n"
    "  trainer:   arc_v3 publish s3://bucket/run --step 101 --next shard0.safetensors --prev "
    "old0.safetensors --shard 0/2\n"
    "  region:    arc_v3 follow s3://bucket/run /models/run   (or pull once)\n\n"
    "PREV/NEXT are single .safetensors files or sharded checkpoint directories\n"
    "(model.safetensors.index.json is carried along). Outputs are written to a temporary\n"
    "file beside the target, fsynced and renamed: an error or a kill never leaves a\n"
    "half-written file under a final name; an output that exists is replaced only with\n"
    "-f/--force (pull: a directory of other files only with --force). Run\n"
    "`arc_v3 COMMAND --help` for details.";

int Main(int argc, char** argv) {
  CLI::App app("arc_v3 " + std::string(VersionString()) + kAppHelp, "arc_v3");
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(VersionString()));
  CheckpointCommands checkpoint_commands(&app);
  SyncCommands sync_commands(&app);

  if (ReportTypo(app, argc, argv)) return kExitUsage;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (sync_commands.parsed()) return sync_commands.Run();
  return checkpoint_commands.Run(app.get_subcommands()[0]->get_name().c_str());
}

}  // namespace
}  // namespace arc_v3

// The library returns errors as Status; what escapes as an exception (out of memory in
// the CLI's own code, a bug) ends the command with a message rather than an abort.
int main(int argc, char** argv) {
  try {
    return arc_v3::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "arc_v3: error: out of memory\n");
    return arc_v3::ExitCodeFor(arc_v3::Status(arc_v3::ErrorCode::kOutOfMemory, ""));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arc_v3: error: internal: %s\n", e.what());
    return arc_v3::kExitError;
  }
}

// The arc_v3 command's sync subcommands (publish, pull, follow, mirror, log, prune, keygen)
// over the file-level calls of arc_v3_sync.hpp.
#ifndef ARC_V3_TOOLS_CLI_SYNC_COMMANDS_H_
#define ARC_V3_TOOLS_CLI_SYNC_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "arc_v3_sync.hpp"

namespace arc_v3 {

class SyncCommands {
 public:
  // Adds the subcommands to `app`.
  explicit SyncCommands(CLI::App* app);
  // Whether the command line chose one of them (after parsing).
  bool parsed() const;
  // Runs the chosen one; returns the process's exit code.
  int Run();

 private:
  const char* Name() const;        // the chosen subcommand's
  StoreSettings Settings() const;  // --retries, --connections
  // The options every subcommand takes (--json, -q, --retries, --connections; -T).
  void AddCommon(CLI::App* cmd, bool threads);
  // --trusted-keys FILE (repeatable; with `env`, $ARC_V3_TRUSTED_KEYS too), and 1.x's
  // spelling --trust ($ARC_V3_TRUST), hidden: Run() adds what it names to trusted_keys_.
  void AddTrustedKeys(CLI::App* cmd, const std::string& help, bool env);
  void AddPublish(CLI::App* app);
  void AddPull(CLI::App* app);
  void AddFollow(CLI::App* app);
  void AddMirror(CLI::App* app);
  void AddLog(CLI::App* app);
  void AddKeygen(CLI::App* app);
  void AddPrune(CLI::App* app);
  int RunKeygen();
  int RunPublish();
  int RunPull(PullFilesOptions pull);
  int RunFollow(const PullFilesOptions& pull);
  int RunMirror();
  int RunVerify();
  int RunLog();
  int RunPrune();

  CLI::App *publish_, *pull_, *follow_, *mirror_, *log_, *prune_, *keygen_;
  std::string store_, dir_, next_, prev_, shard_ = "0/1", incarnation_, work_dir_, tensors_, rows_,
                                          format_ = "arc_v3", index_;
  uint64_t step_ = kLatestStep, base_step_ = kNoStep, anchor_every_ = 10, until_ = kNoStep;
  double interval_ = 2;
  std::string events_;  // follow --events HOST:PORT
  int threads_ = 0, effort_ = kDefaultEffort, retries_ = 5, connections_ = 8, max_failures_ = 10;
  uint32_t keep_anchors_ = 2;
  std::string min_age_ = "0";
  bool json_ = false, quiet_ = false, reset_ = false, dry_run_ = false, no_sync_ = false,
       force_ = false;
  bool no_index_ = false, verify_ = false, follow_loop_ = false;
  std::string dst_;
  int parallel_ = 8;
  std::string sign_key_, key_path_;
  std::vector<std::string> trusted_keys_, trust_alias_;
};

}  // namespace arc_v3

#endif  // ARC_V3_TOOLS_CLI_SYNC_COMMANDS_H_

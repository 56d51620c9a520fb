// What a pulled directory records of itself (DIR/.arc_v3/state.json), its lock, and the
// journal that makes a pull's renames all-or-nothing across a crash (specified in
// src/sync/REGION_STATE.md). Internal to the sync layer.
#ifndef ARC_V3_SRC_SYNC_DIR_STATE_H_
#define ARC_V3_SRC_SYNC_DIR_STATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/protocol.h"

namespace arc_v3 {
namespace sync {

constexpr char kStateDir[] = ".arc_v3";

// A file as a verified apply left it: its size and modification time (a cheap check that
// nobody changed it) and each tensor's checksum as stored (checkpoint::TensorChecksum).
struct FileRecord {
  std::string path;  // relative to DIR
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::vector<TensorChecksum> tensors;
};

// A partial pull's choice of tensors and rows.
struct Selection {
  std::string tensors;  // ECMAScript regex; "" = every tensor, every row (a full pull)
  uint64_t row_begin = 0, row_end = UINT64_MAX;
  bool partial() const { return !tensors.empty(); }
  bool operator==(const Selection& o) const {
    return tensors == o.tensors && row_begin == o.row_begin && row_end == o.row_end;
  }
};

struct ShardState {
  std::string name;  // the published file's name
  FileRecord file;   // DIR/name
  FileRecord rows;   // partial pulls: the rows the next delta needs (path "" otherwise)
};

struct DirState {
  std::string store;
  uint64_t step = kNoStep;
  uint64_t manifest_xxh3 = 0;  // of the step's manifest bytes: which store's step it is
  uint64_t run = 0;            // the step's run (0: not recorded, a state written before 2.0)
  // SHA-256 (hex) of the step's root bytes ("": not recorded): a trusting pull's chain
  // joins DIR only where a signed root names this as its base root's.
  std::string root_sha256;
  std::string incarnation;  // of the step's root ("": not recorded, a state before 2.0)
  // The ids of the keys DIR was pulled trusting (empty: pulled without trust). A pull
  // without trust refuses such a DIR unless it is reset: trust is not switched off by
  // leaving a flag out.
  std::vector<std::string> trusted_keys;
  Selection selection;
  std::vector<ShardState> shards;  // in shard order
  bool index = false;  // DIR/model.safetensors.index.json is the step's (written by the pull)
};

// Holds DIR/.arc_v3/lock (flock) for its lifetime: one pull per directory at a time.
class DirLock {
 public:
  ~DirLock();
  // Creates DIR/.arc_v3 if needed. kInvalidArgument if another process holds the lock.
  Status Acquire(const std::string& dir);

 private:
  int fd_ = -1;
};

// Reads DIR's state: kNotFound if DIR was never pulled into, kCorruptHeader if the file
// is damaged.
Status ReadState(const std::string& dir, DirState* state);
// Replaces DIR's state atomically (temporary file, fsync, rename, fsync).
Status WriteState(const std::string& dir, const DirState& state);
std::string StateJson(const DirState& state);
// state.json's text (kCorruptHeader naming `where` if it breaks a rule).
Status ParseState(const std::string& text, const std::string& where, DirState* state);

// The size, modification time and tensor checksums of DIR/path.
Status RecordFile(const std::string& dir, const std::string& path, FileRecord* record);
// Whether DIR/record.path still is what `record` says: by size and time, else by
// rehashing its tensors (then *retimed is set: the record's time was refreshed).
// kChecksumMismatch names the file and the first difference.
Status CheckFile(const std::string& dir, FileRecord* record, bool* retimed);

// A commit: files to rename from the stage into DIR, files to remove, the new state.
struct Journal {
  std::vector<std::pair<std::string, std::string>> moves;  // (from, to), relative to DIR
  std::vector<std::string> removes;                        // relative to DIR
  DirState state;
};

// commit.json's text, and back (kCorruptHeader naming `where`).
std::string JournalJson(const Journal& journal);
Status ParseJournal(const std::string& text, const std::string& where, Journal* journal);
// Writes the journal, then carries it out; `after_move` (may be empty) is called after
// each rename, for tests.
Status Commit(const std::string& dir, const Journal& journal,
              const std::function<void(size_t moved)>& after_move);
// Finishes a commit a crash interrupted, if DIR has a journal; a no-op otherwise.
Status RecoverJournal(const std::string& dir);
// Forgets an unfinishable journal and its stage (for a reset, which rewrites every file).
Status DropJournal(const std::string& dir);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_DIR_STATE_H_

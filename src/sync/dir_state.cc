// A pulled directory's state, lock and commit journal (see dir_state.h).
#include "src/sync/dir_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/strict_json.h"
#include "src/common/file_io.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr char kStateFile[] = "state.json";
constexpr char kJournalFile[] = "commit.json";

std::string StatePath(const std::string& dir, const char* name) {
  return (fs::path(dir) / kStateDir / name).string();
}

// A local file operation that failed: kIoError naming `what` and the system's reason.
Status Errno(const std::string& what) {
  return Status(ErrorCode::kIoError, what + ": " + std::strerror(errno));
}

// Writes `text` to `path` atomically and durably.
Status WriteDurably(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  const int fd = open(temp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(temp + ": cannot create");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return Errno(temp + ": cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) return Errno(temp + ": cannot sync");
  if (rename(temp.c_str(), path.c_str()) != 0) return Errno(path + ": cannot replace");
  return file_io::SyncDirectory(fs::path(path).parent_path().string());
}

Status ReadText(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, path + ": not found");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *text = buffer.str();
  return Status::Ok();
}

OrderedJson SumsJson(const std::vector<TensorChecksum>& sums) {
  OrderedJson out = OrderedJson::array();
  for (const TensorChecksum& t : sums) out.push_back({t.name, checkpoint::HexU64(t.xxh3)});
  return out;
}

OrderedJson FileJson(const FileRecord& f) {
  return {{"path", f.path},
          {"size", f.size},
          {"mtime_ns", f.mtime_ns},
          {"tensors", SumsJson(f.tensors)}};
}

OrderedJson StateToJson(const DirState& s) {
  OrderedJson shards = OrderedJson::array();
  for (const ShardState& sh : s.shards) {
    shards.push_back({{"name", sh.name},
                      {"file", FileJson(sh.file)},
                      {"rows", sh.rows.path.empty() ? OrderedJson(nullptr) : FileJson(sh.rows)}});
  }
  OrderedJson selection = nullptr;
  if (s.selection.partial()) {
    selection = {{"tensors", s.selection.tensors},
                 {"rows",
                  {s.selection.row_begin, s.selection.row_end == UINT64_MAX
                                              ? OrderedJson(nullptr)
                                              : OrderedJson(s.selection.row_end)}}};
  }
  OrderedJson state = {
      {"format", kProtocolName}, {"version", kProtocolVersion},
      {"kind", "directory"},     {"store", s.store},
      {"step", s.step},          {"manifest_xxh3", checkpoint::HexU64(s.manifest_xxh3)},
      {"selection", selection},  {"shards", shards}};
  if (s.index) state["index"] = true;
  if (s.run != 0) state["run"] = checkpoint::HexU64(s.run);
  if (!s.root_sha256.empty()) state["root_sha256"] = s.root_sha256;
  if (!s.incarnation.empty()) state["incarnation"] = s.incarnation;
  if (!s.trusted_keys.empty()) state["trusted_keys"] = s.trusted_keys;
  return state;
}

// Integers as the state writes them; anything else (a float, a negative size) is damage,
// not a value to convert.
uint64_t U64(const Json& j) {
  if (!j.is_number_unsigned()) throw std::runtime_error("not an unsigned integer: " + j.dump());
  return j.get<uint64_t>();
}
int64_t I64(const Json& j) {
  if (!j.is_number_integer()) throw std::runtime_error("not an integer: " + j.dump());
  return j.get<int64_t>();
}

uint64_t ParseHex(const std::string& text) {
  if (text.size() != 16) throw std::runtime_error("not 16 hex digits");
  uint64_t v = 0;
  for (char c : text) {
    const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) throw std::runtime_error("not 16 lowercase hex digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// A SHA-256 in hex (a root's, a key's id): 64 lowercase hex digits.
std::string Sha256Hex(const Json& j) {
  Digest digest;
  const std::string text = j.get<std::string>();
  if (!ParseDigestHex(text, &digest))
    throw std::runtime_error("'" + text + "' is not 64 lowercase hex digits");
  return text;
}

// A path inside DIR: relative, without "." or ".." components.
std::string InsidePath(const Json& j) {
  const std::string path = j.get<std::string>();
  if (path.empty() || path[0] == '/')
    throw std::runtime_error("path '" + path + "' is not relative");
  for (const auto& part : fs::path(path)) {
    if (part == "." || part == ".." || part.empty())
      throw std::runtime_error("path '" + path + "' leaves DIR");
  }
  return path;
}

FileRecord FileFromJson(const Json& j) {
  FileRecord f;
  f.path = InsidePath(j.at("path"));
  f.size = U64(j.at("size"));
  f.mtime_ns = I64(j.at("mtime_ns"));
  for (const Json& t : j.at("tensors"))
    f.tensors.push_back({t.at(0).get<std::string>(), ParseHex(t.at(1).get<std::string>())});
  return f;
}

DirState StateFromJson(const Json& j) {
  // Version 1 (arc_v3 1.x) has the same fields; its manifest_xxh3 names no version-2 root,
  // so such a directory moves to a version-2 store through an anchor.
  const uint64_t version = U64(j.at("version"));
  if (j.at("format").get<std::string>() != kProtocolName ||
      j.at("kind").get<std::string>() != "directory" ||
      (version != 1 && version != kProtocolVersion)) {
    throw std::runtime_error("not a directory state of version 1 or " +
                             std::to_string(kProtocolVersion));
  }
  DirState s;
  s.store = j.at("store").get<std::string>();
  s.step = U64(j.at("step"));
  s.manifest_xxh3 = ParseHex(j.at("manifest_xxh3").get<std::string>());
  if (j.contains("run")) s.run = ParseHex(j.at("run").get<std::string>());
  if (j.contains("root_sha256")) s.root_sha256 = Sha256Hex(j.at("root_sha256"));
  if (j.contains("incarnation")) {
    s.incarnation = j.at("incarnation").get<std::string>();
    if (!ValidIncarnation(s.incarnation))
      throw std::runtime_error("not an incarnation: '" + s.incarnation + "'");
  }
  if (j.contains("trusted_keys")) {
    const Json& keys = j.at("trusted_keys");
    if (!keys.is_array() || keys.empty())
      throw std::runtime_error("trusted_keys is not a list of key ids");
    for (const Json& id : keys) s.trusted_keys.push_back(Sha256Hex(id));
  }
  const Json& sel = j.at("selection");
  if (!sel.is_null()) {
    s.selection.tensors = sel.at("tensors").get<std::string>();
    s.selection.row_begin = U64(sel.at("rows").at(0));
    const Json& end = sel.at("rows").at(1);
    s.selection.row_end = end.is_null() ? UINT64_MAX : U64(end);
    if (s.selection.tensors.empty()) throw std::runtime_error("empty selection");
  }
  for (const Json& sh : j.at("shards")) {
    ShardState shard;
    shard.name = InsidePath(sh.at("name"));
    shard.file = FileFromJson(sh.at("file"));
    if (!sh.at("rows").is_null()) shard.rows = FileFromJson(sh.at("rows"));
    s.shards.push_back(std::move(shard));
  }
  s.index = j.contains("index") && j.at("index").get<bool>();
  return s;
}

std::string Relative(const std::string& dir, const std::string& path) {
  return (fs::path(dir) / path).string();
}

}  // namespace

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

Status DirLock::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / kStateDir, ec);
  if (ec)
    return Status(ErrorCode::kIoError, dir + ": cannot create " + kStateDir + ": " + ec.message());
  const std::string path = StatePath(dir, "lock");
  fd_ = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd_ < 0) return Errno(path + ": cannot open");
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status(ErrorCode::kInvalidArgument, dir + " is being pulled into by another process");
  }
  return Status::Ok();
}

std::string StateJson(const DirState& state) { return StateToJson(state).dump(1) + "\n"; }

Status ParseState(const std::string& text, const std::string& where, DirState* state) {
  try {
    *state = StateFromJson(strict_json::Parse(text, where));
  } catch (const strict_json::Error& e) {
    return Status(ErrorCode::kCorruptHeader, e.what);
  } catch (const std::exception& e) {
    return Status(ErrorCode::kCorruptHeader, where + " is damaged (" + e.what() + ")");
  }
  return Status::Ok();
}

Status ReadState(const std::string& dir, DirState* state) {
  std::string text;
  Status s = ReadText(StatePath(dir, kStateFile), &text);
  if (!s.ok()) return Status(ErrorCode::kNotFound, dir + " holds no pulled step");
  return ParseState(text, StatePath(dir, kStateFile), state);
}

Status WriteState(const std::string& dir, const DirState& state) {
  return WriteDurably(StatePath(dir, kStateFile), StateJson(state));
}

Status RecordFile(const std::string& dir, const std::string& path, FileRecord* record) {
  const std::string full = Relative(dir, path);
  struct stat st;
  if (stat(full.c_str(), &st) != 0) return Errno(full + ": cannot stat");
  safetensors::File file;
  ARC_V3_RETURN_IF_ERROR(safetensors::File::Open(full, &file));
  record->path = path;
  record->size = static_cast<uint64_t>(st.st_size);
  record->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  record->tensors.clear();
  for (const safetensors::TensorInfo& info : file.tensors()) {
    checkpoint::TensorEntry t;
    t.dtype = info.dtype;
    t.shape = info.shape;
    record->tensors.push_back({info.name, checkpoint::TensorChecksum(t, file.data(info))});
  }
  return Status::Ok();
}

Status CheckFile(const std::string& dir, FileRecord* record, bool* retimed) {
  *retimed = false;
  const std::string full = Relative(dir, record->path);
  struct stat st;
  const auto differs = [&](const std::string& why) {
    return Status(ErrorCode::kChecksumMismatch, full + " is not the file the last pull wrote (" +
                                                    why +
                                                    "): refusing to apply onto an unknown base");
  };
  if (stat(full.c_str(), &st) != 0) return differs("it is gone");
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (static_cast<uint64_t>(st.st_size) == record->size && mtime == record->mtime_ns)
    return Status::Ok();
  if (static_cast<uint64_t>(st.st_size) != record->size) return differs("its size changed");
  // Touched, copied or restored: its contents decide.
  FileRecord now;
  Status s = RecordFile(dir, record->path, &now);
  if (!s.ok()) return differs(s.message());
  if (now.size != record->size) return differs("its size changed");
  if (now.tensors.size() != record->tensors.size()) return differs("its tensors changed");
  for (size_t i = 0; i < now.tensors.size(); ++i) {
    if (now.tensors[i].name != record->tensors[i].name ||
        now.tensors[i].xxh3 != record->tensors[i].xxh3) {
      return differs("tensor '" + record->tensors[i].name + "' changed");
    }
  }
  record->mtime_ns = now.mtime_ns;
  *retimed = true;
  return Status::Ok();
}

namespace {

Status RunJournal(const std::string& dir, const Journal& j,
                  const std::function<void(size_t moved)>& after_move) {
  std::error_code ec;
  for (size_t i = 0; i < j.moves.size(); ++i) {
    const auto& move = j.moves[i];
    const std::string from = Relative(dir, move.first), to = Relative(dir, move.second);
    if (fs::exists(from, ec)) {
      if (rename(from.c_str(), to.c_str()) != 0) return Errno(to + ": cannot rename into place");
    } else if (!fs::exists(to, ec)) {
      return Status(ErrorCode::kInternal,
                    dir + ": the commit journal names " + move.first + ", which is gone");
    }
    if (after_move) after_move(i + 1);
  }
  for (const std::string& r : j.removes) fs::remove(Relative(dir, r), ec);
  ARC_V3_RETURN_IF_ERROR(file_io::SyncDirectory(dir));
  ARC_V3_RETURN_IF_ERROR(file_io::SyncDirectory((fs::path(dir) / kStateDir).string()));
  if (fs::is_directory(fs::path(dir) / kStateDir / "rows", ec)) {
    ARC_V3_RETURN_IF_ERROR(file_io::SyncDirectory((fs::path(dir) / kStateDir / "rows").string()));
  }
  ARC_V3_RETURN_IF_ERROR(WriteState(dir, j.state));
  fs::remove(StatePath(dir, kJournalFile), ec);
  fs::remove_all(fs::path(dir) / kStateDir / "stage", ec);  // what the journal moved out of
  return file_io::SyncDirectory((fs::path(dir) / kStateDir).string());
}

}  // namespace

std::string JournalJson(const Journal& journal) {
  OrderedJson moves = OrderedJson::array();
  for (const auto& m : journal.moves) moves.push_back({m.first, m.second});
  const OrderedJson doc = {
      {"moves", moves}, {"removes", journal.removes}, {"state", StateToJson(journal.state)}};
  return doc.dump(1) + "\n";
}

Status ParseJournal(const std::string& text, const std::string& where, Journal* journal) {
  Journal j;
  try {
    const Json doc = strict_json::Parse(text, where);
    for (const Json& m : doc.at("moves"))
      j.moves.emplace_back(InsidePath(m.at(0)), InsidePath(m.at(1)));
    for (const Json& r : doc.at("removes")) j.removes.push_back(InsidePath(r));
    j.state = StateFromJson(doc.at("state"));
  } catch (const strict_json::Error& e) {
    return Status(ErrorCode::kCorruptHeader, e.what);
  } catch (const std::exception& e) {
    return Status(ErrorCode::kCorruptHeader, where + " is damaged (" + e.what() + ")");
  }
  *journal = std::move(j);
  return Status::Ok();
}

Status Commit(const std::string& dir, const Journal& journal,
              const std::function<void(size_t moved)>& after_move) {
  ARC_V3_RETURN_IF_ERROR(WriteDurably(StatePath(dir, kJournalFile), JournalJson(journal)));
  return RunJournal(dir, journal, after_move);
}

Status DropJournal(const std::string& dir) {
  std::error_code ec;
  fs::remove(StatePath(dir, kJournalFile), ec);
  fs::remove_all(fs::path(dir) / kStateDir / "stage", ec);
  return ec ? Status(ErrorCode::kInvalidArgument,
                     dir + ": cannot drop its commit journal: " + ec.message())
            : file_io::SyncDirectory((fs::path(dir) / kStateDir).string());
}

Status RecoverJournal(const std::string& dir) {
  std::string text;
  if (!ReadText(StatePath(dir, kJournalFile), &text).ok()) return Status::Ok();
  Journal j;
  ARC_V3_RETURN_IF_ERROR(ParseJournal(text, StatePath(dir, kJournalFile), &j));
  return RunJournal(dir, j, nullptr);
}

}  // namespace sync
}  // namespace arc_v3

// What the arc_v3 command's subcommands share: exit codes and byte counts for people.
#ifndef ARC_V3_TOOLS_CLI_CLI_COMMON_H_
#define ARC_V3_TOOLS_CLI_CLI_COMMON_H_

#include <cstdio>
#include <string>

#include "arc_v3.hpp"

namespace arc_v3 {

// Exit codes (documented in --help).
constexpr int kExitOk = 0;
constexpr int kExitError = 1;      // I/O errors, bad arguments found after parsing, bugs
constexpr int kExitUsage = 2;      // command line not understood
constexpr int kExitWrongBase = 3;  // PREV (or a pulled directory) is not the delta's base
constexpr int kExitCorrupt = 4;    // a delta file or store object is corrupt, truncated or unknown
constexpr int kExitUnreachable = 5;  // the store cannot be reached or refuses the credentials
constexpr int kExitNotFound = 6;     // the store lacks the step or object asked for
constexpr int kExitConflict =
    7;  // the output exists (no --force), or the store holds other contents
// Refused by --trusted-keys: unsigned, another key or digest, older, another run.
constexpr int kExitUntrusted = 8;

constexpr char kExitCodesHelp[] =
    "Exit codes: 0 success; 1 I/O or other error; 2 usage error; 3 wrong base (PREV, or the\n"
    "directory pulled into, is not the checkpoint the delta was made from); 4 corrupt,\n"
    "truncated or unsupported delta file or store object; 5 store unreachable or access\n"
    "denied; 6 no such step or object in the store; 7 the output already exists (give\n"
    "-f/--force to replace it), or a shard of the step was already published with another\n"
    "file; 8 a step refused by --trusted-keys (unsigned, signed by another key, a digest\n"
    "that differs, older than DIR's step or of another run). On any error no output file\n"
    "is changed.";

inline int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kOk: return kExitOk;
    case ErrorCode::kChecksumMismatch:
    case ErrorCode::kWrongBase:
    case ErrorCode::kHistoryMismatch:
    case ErrorCode::kSizeMismatch: return kExitWrongBase;
    case ErrorCode::kTruncated:
    case ErrorCode::kBadMagic:
    case ErrorCode::kUnsupportedVersion:
    case ErrorCode::kReservedBitsSet:
    case ErrorCode::kCorruptHeader:
    case ErrorCode::kCorruptChunk:
    case ErrorCode::kCodecFailure: return kExitCorrupt;
    case ErrorCode::kUnavailable:
    case ErrorCode::kPermissionDenied: return kExitUnreachable;
    case ErrorCode::kNotFound: return kExitNotFound;
    case ErrorCode::kAlreadyExists: return kExitConflict;
    case ErrorCode::kUntrusted: return kExitUntrusted;
    default: return kExitError;
  }
}

// What the command line adds to a library error: the flag that changes the outcome, where
// one may ("" where none). The library's messages say what is wrong, never which flag.
inline std::string HintFor(const std::string& command, const Status& s) {
  const ErrorCode c = s.code();
  if ((command == "diff" || command == "apply") && c == ErrorCode::kAlreadyExists) {
    return "give -f/--force to replace it";
  }
  if (command == "pull" || command == "follow") {
    if (c == ErrorCode::kAlreadyExists) return "give -f/--force to pull into it anyway";
    if (c == ErrorCode::kChecksumMismatch || c == ErrorCode::kCorruptHeader) {
      return "if DIR's own files or state are what is wrong, 'arc_v3 pull --reset STORE DIR' "
             "rebuilds DIR "
             "from an anchor";
    }
    if (c == ErrorCode::kUntrusted)
      return "a step older than DIR's, or of another run, is taken only with --reset";
  }
  if (command == "publish") {
    if (c == ErrorCode::kChecksumMismatch)
      return "leave out --prev to publish the step as an anchor";
    if (c == ErrorCode::kNotFound) {
      return "leave out --prev to publish an anchor, or name a committed base with --base-step";
    }
    if (c == ErrorCode::kAlreadyExists)
      return "a restarted trainer publishes under a new --incarnation";
  }
  return "";
}

// Prints "arc_v3 COMMAND: error: ..." and the command line's hint, if any, to stderr.
inline void PrintError(const char* command, const Status& s) {
  std::fprintf(stderr, "arc_v3 %s: error: %s\n", command, s.ToString().c_str());
  const std::string hint = HintFor(command, s);
  if (!hint.empty()) std::fprintf(stderr, "arc_v3 %s: hint: %s\n", command, hint.c_str());
}

inline std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

// Parses --rows A:B (A: and :B allowed) into [begin, end); false if malformed.
inline bool ParseRows(const std::string& text, uint64_t* begin, uint64_t* end) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  const auto parse = [](const std::string& s, uint64_t* v) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19)
      return false;
    *v = std::stoull(s);
    return true;
  };
  *begin = 0;
  *end = UINT64_MAX;
  if (!a.empty() && !parse(a, begin)) return false;
  if (!b.empty() && !parse(b, end)) return false;
  return *begin <= *end;
}

}  // namespace arc_v3

#endif  // ARC_V3_TOOLS_CLI_CLI_COMMON_H_

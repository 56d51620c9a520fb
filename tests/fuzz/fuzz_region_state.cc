// Fuzz target: what a region reads back of itself after a crash or from a tampered disk
// (src/sync/dir_state.h; src/sync/REGION_STATE.md): `state.json`
// and the commit journal `commit.json`. Input: one byte choosing which, then its text.
// Promises checked: no crash or out-of-bounds access; a refusal is an error with a
// message; every path accepted stays inside the directory (relative, no `..`); what is
// accepted names no member twice and re-serialises canonically (written, read back, written again:
// the same text).
#include <algorithm>
#include <cstdint>
#include <string>

#include "src/sync/dir_state.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_json.h"

namespace arc_v3 {
namespace fuzz {
namespace {

void CheckInside(const std::string& path) {
  FUZZ_CHECK(!path.empty() && path[0] != '/', "an absolute or empty path was accepted");
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find('/', begin), path.size());
    FUZZ_CHECK(path.compare(begin, end - begin, "..") != 0 || end - begin != 2,
               "a path leaving the directory was accepted");
    begin = end + 1;
  }
}

void CheckState(const sync::DirState& state) {
  for (const sync::ShardState& s : state.shards) {
    CheckInside(s.name);
    CheckInside(s.file.path);
    if (!s.rows.path.empty()) CheckInside(s.rows.path);
  }
}

}  // namespace

int FuzzRegionState(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    sync::DirState state;
    const Status s = sync::ParseState(text, "state.json", &state);
    FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
    if (!s.ok()) return 0;
    CheckOneReading(text);
    CheckState(state);
    const std::string once = sync::StateJson(state);
    sync::DirState again;
    FUZZ_CHECK(sync::ParseState(once, "state.json", &again).ok(), "a written state is refused");
    FUZZ_CHECK(sync::StateJson(again) == once, "a state does not re-serialise to itself");
  } else {
    sync::Journal journal;
    const Status s = sync::ParseJournal(text, "commit.json", &journal);
    FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
    if (!s.ok()) return 0;
    CheckOneReading(text);
    for (const auto& move : journal.moves) {
      CheckInside(move.first);
      CheckInside(move.second);
    }
    for (const std::string& r : journal.removes) CheckInside(r);
    CheckState(journal.state);
    const std::string once = sync::JournalJson(journal);
    sync::Journal again;
    FUZZ_CHECK(sync::ParseJournal(once, "commit.json", &again).ok(),
               "a written journal is refused");
    FUZZ_CHECK(sync::JournalJson(again) == once, "a journal does not re-serialise to itself");
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzRegionState)

}  // namespace fuzz
}  // namespace arc_v3

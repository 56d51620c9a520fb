// The checks trust makes (see trust.h).
#include "src/sync/trust.h"

#include <set>

#include "src/checkpoint/container.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {

Status LoadTrust(const std::vector<std::string>& paths, Trust* trust) {
  trust->keys.clear();
  for (const std::string& path : paths) {
    std::vector<PublicKey> keys;
    ARC_V3_RETURN_IF_ERROR(PublicKey::LoadAll(path, &keys));
    for (PublicKey& key : keys) trust->keys.push_back(std::move(key));
  }
  return Status::Ok();
}

std::vector<std::string> Trust::ids() const {
  std::set<std::string> unique;
  for (const PublicKey& key : keys) unique.insert(key.id());
  return std::vector<std::string>(unique.begin(), unique.end());
}

Status UnderTrust(const Trust& trust, Status s) {
  if (!trust.on()) return s;
  switch (s.code()) {
    case ErrorCode::kCorruptChunk:
    case ErrorCode::kCorruptHeader:
    case ErrorCode::kTruncated:
    case ErrorCode::kUnsupportedVersion:
      return Status(ErrorCode::kUntrusted, "does not verify: " + s.message());
    default: return s;
  }
}

Status CheckTrusted(const Trust& trust, const StepManifest& root, const std::string& where) {
  if (!trust.on()) return Status::Ok();
  std::string keyid;
  Status s = VerifySigned(root.signatures, trust.keys, where, &keyid);
  return InContext("step " + std::to_string(root.step), s);
}

Status CheckProgress(const Trust& trust, uint64_t held_step, uint64_t held_run,
                     const StepManifest& target, const std::string& holder) {
  if (!trust.on() || held_step == kNoStep) return Status::Ok();
  if (target.step < held_step) {
    return Status(ErrorCode::kUntrusted, "step " + std::to_string(target.step) +
                                             " is older than step " + std::to_string(held_step) +
                                             ", which " + holder +
                                             " holds: a trusting reader never goes back");
  }
  if (held_run != 0 && target.run != held_run) {
    return Status(ErrorCode::kUntrusted, "step " + std::to_string(target.step) + " is of run " +
                                             checkpoint::HexU64(target.run) + ", not of run " +
                                             checkpoint::HexU64(held_run) + " that " + holder +
                                             " holds");
  }
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3

// What a reader trusts (SIGNED_STEPS.md, "Signed steps") and the checks trust makes of the
// steps a pull or follower takes: signed roots, no step older than or of another run than
// the one held, and damage that is kUntrusted rather than routed around. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_TRUST_H_
#define ARC_V3_SRC_SYNC_TRUST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/protocol.h"
#include "src/sync/signing.h"

namespace arc_v3 {
namespace sync {

// What a reader trusts (SIGNED_STEPS.md, "Signed steps"): no key, and steps are taken
// unauthenticated; else every root on a route must be signed by one of `keys`, and every
// document and byte it names must have the SHA-256 the signed documents give.
struct Trust {
  std::vector<PublicKey> keys;
  bool on() const { return !keys.empty(); }
  std::vector<std::string> ids() const;  // the keys' ids, sorted, each once
};
// Loads every key of each PEM trust file (kInvalidArgument naming a file that is not one).
Status LoadTrust(const std::vector<std::string>& paths, Trust* trust);
// What a failed check of the store's bytes is under trust: kUntrusted, its message naming
// the cause, for a damaged document or object (corrupt, truncated, of an unknown version),
// which a trusting reader never routes around. Without trust, or any other error: `s`.
Status UnderTrust(const Trust& trust, Status s);
// Under trust: the root of `hop` signed by a trusted key (kUntrusted otherwise).
Status CheckTrusted(const Trust& trust, const StepManifest& root, const std::string& where);
// Under trust, a holder of `held_step` of run `held_run` (0: not recorded) takes no older
// step and no step of another run (kUntrusted naming `holder`).
Status CheckProgress(const Trust& trust, uint64_t held_step, uint64_t held_run,
                     const StepManifest& target, const std::string& holder);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_TRUST_H_

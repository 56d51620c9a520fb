// What publishing (publish.cc) takes from the commit (commit.cc): the keys a publisher signs
// with and trusts, how a republished record is compared with the one already there, and the
// commit that follows a shard's record. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_COMMIT_H_
#define ARC_V3_SRC_SYNC_COMMIT_H_

#include <memory>
#include <string>
#include <vector>

#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

// What a publisher signs with, and whose signatures its completers take.
struct Signer {
  std::unique_ptr<SigningKey> key;  // null: nothing is signed
  std::vector<PublicKey> trusted;   // the key's public half, and PublishFileOptions::trusted_keys
  const SigningKey* get() const { return key.get(); }
};

// Loads `sign_key` (none: an unsigned signer) and the public keys of the `trust` files.
Status LoadSigner(const std::string& sign_key, const std::vector<std::string>& trust,
                  Signer* signer);

// What makes `record` another file than `existing`, the same shard of the same step
// published before ("" if it is the same file: same name, size, base step, tensors and
// index). How it was coded (anchor or not, effort, format) is not compared.
std::string FileDifference(const ShardRecord& existing, const ShardRecord& record);

// The kAlreadyExists error for `record` published again with another file (`committed`:
// its step is committed).
Status Conflict(Store* store, const ShardRecord& record, const std::string& difference,
                bool committed);

// The record of `shard` in a committed step: from the record key of the root's
// incarnation, checked through its group index.
Status CommittedRecord(Store* store, const StepManifest& root, uint32_t shard, ShardRecord* record);

// The step of `ours` once its group is complete, then later steps that waited for it as
// their base (`ours` null: every group is complete).
Status CommitFrom(Store* store, uint64_t step, uint32_t count, const std::string& inc,
                  const ShardRecord* ours, const Signer& signer, CommitResult* result);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_COMMIT_H_

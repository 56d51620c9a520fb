// The loop every follower shares (Follower::Follow, sync::Follow, `arc_v3 follow`): poll the
// store's `latest` pointer, pull each newer step, wait for a store or step that is not
// there yet, retry a store that fails. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_FOLLOW_H_
#define ARC_V3_SRC_SYNC_FOLLOW_H_

#include <cstdint>
#include <functional>

#include "arc_v3_sync.hpp"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

// `open` gives the store, opening it if needed (kNotFound: not there yet, waited for);
// `held` is the step held at the start (kNoStep: none). `pull(store, step, anchor, event,
// stop)` pulls `step`, a committed step newer than the one held (by the anchor route if
// `anchor`): it fills event->step and event->lag_seconds and reports the event to its
// caller itself, setting *stop to end the loop. `note` is told kWaiting, kRetrying and
// kRefused events; false ends the loop. `trusting`: a step `pull` refuses as kUntrusted is
// a kRefused event, and the loop goes on: it pulls that step again only once `latest`
// changes, and later steps by their anchor route until one is held (the chain from the
// step held runs through the refused one). Between polls it waits options.interval_seconds,
// less when options.events_listen is set and the store's events name a new step (events.h):
// those only wake the next poll; kInvalidArgument at once if it cannot listen there.
Status FollowLatest(const std::function<Status(Store** store)>& open, uint64_t held, bool trusting,
                    const FollowOptions& options,
                    const std::function<Status(Store* store, uint64_t step, bool anchor,
                                               FollowEvent* event, bool* stop)>& pull,
                    const std::function<bool(const FollowEvent& event)>& note);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_FOLLOW_H_

#include "src/sync/follow.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "src/common/clock.h"
#include "src/common/status_macros.h"
#include "src/sync/events.h"
#include "src/sync/protocol.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

namespace {

// Sleeps `seconds` in slices of at most 0.1 s; true if a stop was asked for meanwhile.
// Ends early (false) once `events` has woken since `seen`.
bool Wait(double seconds, const FollowOptions& options, EventListener* events, uint64_t seen) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(seconds));
  for (;;) {
    if (options.stop_requested && options.stop_requested()) return true;
    const Clock::time_point now = Clock::now();
    if (now >= end) return false;
    const Clock::duration slice =
        std::min<Clock::duration>(end - now, std::chrono::milliseconds(100));
    if (events == nullptr) {
      std::this_thread::sleep_for(slice);
    } else if (events->WaitForWake(seen, std::chrono::duration<double>(slice).count())) {
      return false;
    }
  }
}

// The store events that may end a wait early (FollowOptions::events_listen), if any.
class Wakeups {
 public:
  Status Start(const std::string& listen) {
    return listen.empty() ? Status::Ok() : EventListener::Start(listen, &events_);
  }
  // Called before each poll of `store` (null: none opened): events for it that arrive from
  // now on wake the wait after the poll (none is lost while the poll runs).
  uint64_t Before(Store* store) {
    if (events_ == nullptr) return 0;
    if (store != nullptr && store->url() != watched_) {
      watched_ = store->url();
      events_->Watch(watched_);
    }
    return events_->wakes();
  }
  EventListener* events() const { return events_.get(); }

 private:
  std::unique_ptr<EventListener> events_;
  std::string watched_;
};

// The state of one follow loop between its polls (FollowLatest).
class FollowLoop {
 public:
  using Pull = std::function<Status(Store* store, uint64_t step, bool anchor, FollowEvent* event,
                                    bool* stop)>;
  using Note = std::function<bool(const FollowEvent& event)>;

  FollowLoop(uint64_t held, bool trusting, const FollowOptions& options, const Pull& pull,
             const Note& note)
      : held_(held), trusting_(trusting), options_(options), pull_(pull), note_(note) {}

  bool reached() const {
    return options_.until != kNoStep && held_ != kNoStep && held_ >= options_.until;
  }

  // One poll of `store` (`opened`: whether it could be opened): reads `latest`, pulls a
  // newer step. Ok with *end to return Ok (told to stop, or done); else the loop's error.
  Status Poll(const Status& opened, Store* store, bool* end) {
    bool changed = false;
    Status s = opened;
    if (s.ok()) s = ReadPointer(store, &changed);
    if (s.code() == ErrorCode::kNotFound) {  // no store yet, or nothing committed (or not readable)
      if (!Wait(s)) return Stop(end);
      s = Status::Ok();
    }
    // The pointer may lag a racing commit: while it stands still, a committed step after
    // it counts too.
    if (s.ok() && !changed && latest_ != kNoStep) latest_ = ProbeLater(store, latest_);
    if (s.ok() && latest_ != kNoStep && (held_ == kNoStep || latest_ > held_) &&
        latest_ != refused_) {
      bool stop = false;
      s = PullLatest(store, &stop, end);
      if (*end) return Status::Ok();
      if (s.ok() && stop) return Stop(end);
      // Named by the pointer but not committed (no root) yet: waited for. A committed
      // step whose documents or objects are missing is damage: a failed poll (below).
      if (s.code() == ErrorCode::kNotFound && !Committed(store, latest_)) {
        if (!Wait(s)) return Stop(end);
        s = Status::Ok();
      }
    }
    return Failed(s, end);
  }

 private:
  Status ReadPointer(Store* store, bool* changed) {
    std::vector<uint8_t> bytes;
    ObjectInfo info;
    Status s = store->GetIfChanged(kLatestKey, etag_, kMaxDocumentBytes, &bytes, &info, changed);
    if (s.ok() && *changed) {
      s = ParseLatest(bytes, store->url() + "/" + kLatestKey, &latest_);
      if (s.ok()) etag_ = info.etag;
      refused_ = kNoStep;
    }
    return s;
  }

  // Pulls `latest_`. Refused under trust: reported, and tried once more by its anchor
  // route (the chain from the step held may run through what was refused); refused again,
  // it is kept out until `latest` changes.
  Status PullLatest(Store* store, bool* stop, bool* end) {
    FollowEvent e;
    e.kind = FollowEvent::Kind::kPulled;
    e.steps_behind = held_ == kNoStep ? 0 : latest_ - held_;
    Status s = pull_(store, latest_, around_, &e, stop);
    for (int tries = 0; trusting_ && s.code() == ErrorCode::kUntrusted && tries < 2; ++tries) {
      FollowEvent r;
      r.kind = FollowEvent::Kind::kRefused;
      r.step = latest_;
      r.message = s.message() + (around_ ? "" : " (its anchor route is tried next)");
      if (note_ && !note_(r)) return Stop(end);
      s = Status::Ok();
      if (around_) {
        refused_ = latest_;
        break;
      }
      around_ = true;
      s = pull_(store, latest_, around_, &e, stop);
    }
    if (s.ok() && refused_ != latest_) {
      held_ = e.step;
      waiting_ = false;
      around_ = false;
    }
    return s;
  }

  // Whether the root of `step` exists (a store that cannot tell counts as not).
  static bool Committed(Store* store, uint64_t step) {
    ObjectInfo info;
    return store->Head(RootKey(step), &info).ok();
  }

  // A poll's outcome: ok resets the failures; an unreachable store, or a committed step
  // that cannot be pulled for what is missing, is retried up to max_failures polls in a row.
  Status Failed(const Status& s, bool* end) {
    if (s.ok()) {
      failures_ = 0;
      return s;
    }
    const bool retried = s.code() == ErrorCode::kUnavailable || s.code() == ErrorCode::kNotFound;
    if (!retried || ++failures_ >= std::max(1, options_.max_failures)) return s;
    FollowEvent e;
    e.kind = FollowEvent::Kind::kRetrying;
    e.message = s.ToString();
    e.failures = failures_;
    if (note_ && !note_(e)) return Stop(end);
    return Status::Ok();
  }

  // A kWaiting event, once per wait; false: the caller stops.
  bool Wait(const Status& why) {
    if (waiting_) return true;
    waiting_ = true;
    FollowEvent e;
    e.kind = FollowEvent::Kind::kWaiting;
    e.message = why.message();
    return !note_ || note_(e);
  }

  static Status Stop(bool* end) {
    *end = true;
    return Status::Ok();
  }

  uint64_t held_;
  const bool trusting_;
  const FollowOptions& options_;
  const Pull& pull_;
  const Note& note_;
  std::string etag_;
  uint64_t latest_ = kNoStep;
  uint64_t refused_ = kNoStep;  // refused under trust; tried again once `latest` changes
  bool around_ = false;         // a step was refused since the last pull: go by anchors
  int failures_ = 0;
  bool waiting_ = false;  // a kWaiting event was given for the current wait
};

}  // namespace

Status FollowLatest(const std::function<Status(Store** store)>& open, uint64_t held, bool trusting,
                    const FollowOptions& options,
                    const std::function<Status(Store* store, uint64_t step, bool anchor,
                                               FollowEvent* event, bool* stop)>& pull,
                    const std::function<bool(const FollowEvent& event)>& note) {
  Wakeups wakeups;
  ARC_V3_RETURN_IF_ERROR(wakeups.Start(options.events_listen));
  FollowLoop loop(held, trusting, options, pull, note);
  for (;;) {
    if (loop.reached()) return Status::Ok();
    Store* store = nullptr;
    const Status opened = open(&store);
    const uint64_t seen = wakeups.Before(opened.ok() ? store : nullptr);
    bool end = false;
    ARC_V3_RETURN_IF_ERROR(loop.Poll(opened, store, &end));
    if (end || loop.reached()) return Status::Ok();
    if (Wait(options.interval_seconds, options, wakeups.events(), seen)) return Status::Ok();
  }
}

Status Follow(
    const std::string& store_url, const std::string& dir, const PullOptions& pull,
    const FollowOptions& options,
    const std::function<bool(const FollowEvent& event, const PullReport* pulled)>& on_event) {
  ARC_V3_RETURN_IF_ERROR(CheckTrustKept(dir, pull));
  uint64_t held = kNoStep;
  (void)DirectoryStep(dir, &held);  // none yet, or unreadable (the pull says why): kNoStep
  std::unique_ptr<Store> store;
  const auto open = [&](Store** out) {
    if (store == nullptr) {
      ARC_V3_RETURN_IF_ERROR(OpenStore(store_url, pull.transfer_options(), &store));
    }
    *out = store.get();
    return Status::Ok();
  };
  const auto pull_step = [&](Store* from, uint64_t step, bool anchor, FollowEvent* event,
                             bool* stop) {
    PullOptions o = pull;
    o.step = step;
    o.anchor_route = anchor;
    PullReport report;
    ARC_V3_RETURN_IF_ERROR(Pull(from, dir, o, &report));
    event->step = report.to_step;
    event->lag_seconds = UnixSeconds() - report.published_at;
    *stop = on_event && !on_event(*event, &report);
    return Status::Ok();
  };
  const auto note = [&](const FollowEvent& event) { return !on_event || on_event(event, nullptr); };
  return FollowLatest(open, held, !pull.trusted_keys.empty(), options, pull_step, note);
}

}  // namespace sync
}  // namespace arc_v3

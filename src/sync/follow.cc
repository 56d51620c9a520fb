#include "src/sync/follow.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "src/common/status_macros.h"
#include "src/sync/events.h"
#include "src/sync/protocol.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

// Sleeps `seconds` in slices of at most 0.1 s; true if a stop was asked for meanwhile.
// Ends early (false) once `events` has woken since `seen`.
bool Wait(double seconds, const FollowOptions& options, EventListener* events, uint64_t seen) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
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

}  // namespace

Status FollowLatest(const std::function<Status(Store** store)>& open, uint64_t held, bool trusting,
                    const FollowOptions& options,
                    const std::function<Status(Store* store, uint64_t step, bool anchor, FollowEvent* event,
                                               bool* stop)>& pull,
                    const std::function<bool(const FollowEvent& event)>& note) {
  const auto reached = [&] { return options.until != kNoStep && held != kNoStep && held >= options.until; };
  Wakeups wakeups;
  ARC_V3_RETURN_IF_ERROR(wakeups.Start(options.events_listen));
  std::string etag;
  uint64_t latest = kNoStep;
  uint64_t refused = kNoStep;  // refused under trust; tried again once `latest` changes
  bool around = false;         // a step was refused since the last pull: go by anchors
  int failures = 0;
  bool waiting = false;  // a kWaiting event was given for the current wait
  const auto wait = [&](const Status& why) {
    if (waiting) return true;
    waiting = true;
    FollowEvent e;
    e.kind = FollowEvent::Kind::kWaiting;
    e.message = why.message();
    return !note || note(e);
  };
  for (;;) {
    if (reached()) return Status::Ok();
    Store* store = nullptr;
    bool changed = false;
    Status s = open(&store);
    const uint64_t seen = wakeups.Before(s.ok() ? store : nullptr);
    if (s.ok()) {
      std::vector<uint8_t> bytes;
      ObjectInfo info;
      s = store->GetIfChanged(kLatestKey, etag, kMaxDocumentBytes, &bytes, &info, &changed);
      if (s.ok() && changed) {
        s = ParseLatest(bytes, store->url() + "/" + kLatestKey, &latest);
        if (s.ok()) etag = info.etag;
        refused = kNoStep;
      }
    }
    if (s.code() == ErrorCode::kNotFound) {  // no store yet, or nothing committed (or not readable)
      if (!wait(s)) return Status::Ok();
      s = Status::Ok();
    }
    // The pointer may lag a racing commit: while it stands still, a committed step after
    // it counts too.
    if (s.ok() && !changed && latest != kNoStep) latest = ProbeLater(store, latest);
    if (s.ok() && latest != kNoStep && (held == kNoStep || latest > held) && latest != refused) {
      FollowEvent e;
      e.kind = FollowEvent::Kind::kPulled;
      e.steps_behind = held == kNoStep ? 0 : latest - held;
      bool stop = false;
      s = pull(store, latest, around, &e, &stop);
      // Refused under trust: reported, and tried once more by its anchor route (the chain
      // from the step held may run through what was refused); refused again, it is kept
      // out until `latest` changes.
      for (int tries = 0; trusting && s.code() == ErrorCode::kUntrusted && tries < 2; ++tries) {
        FollowEvent r;
        r.kind = FollowEvent::Kind::kRefused;
        r.step = latest;
        r.message = s.message() + (around ? "" : " (its anchor route is tried next)");
        if (note && !note(r)) return Status::Ok();
        s = Status::Ok();
        if (around) {
          refused = latest;
          break;
        }
        around = true;
        s = pull(store, latest, around, &e, &stop);
      }
      if (s.ok() && refused != latest) {
        held = e.step;
        waiting = false;
        around = false;
        if (stop) return Status::Ok();
      } else if (s.code() == ErrorCode::kNotFound) {  // named by the pointer, not committed yet
        if (!wait(s)) return Status::Ok();
        s = Status::Ok();
      }
    }
    if (s.ok()) {
      failures = 0;
    } else if (s.code() == ErrorCode::kUnavailable && ++failures < std::max(1, options.max_failures)) {
      FollowEvent e;
      e.kind = FollowEvent::Kind::kRetrying;
      e.message = s.ToString();
      e.failures = failures;
      if (note && !note(e)) return Status::Ok();
    } else {
      return s;
    }
    if (reached()) return Status::Ok();
    if (Wait(options.interval_seconds, options, wakeups.events(), seen)) return Status::Ok();
  }
}

Status Follow(const std::string& store_url, const std::string& dir, const PullOptions& pull,
              const FollowOptions& options,
              const std::function<bool(const FollowEvent& event, const PullReport* pulled)>& on_event) {
  ARC_V3_RETURN_IF_ERROR(CheckTrustKept(dir, pull));
  uint64_t held = kNoStep;
  DirectoryStep(dir, &held);  // none yet: kNoStep
  std::unique_ptr<Store> store;
  const auto open = [&](Store** out) {
    if (store == nullptr) {
      ARC_V3_RETURN_IF_ERROR(OpenStore(store_url, pull.store, &store));
    }
    *out = store.get();
    return Status::Ok();
  };
  const auto pull_step = [&](Store* from, uint64_t step, bool anchor, FollowEvent* event, bool* stop) {
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
  return FollowLatest(open, held, !pull.trust.empty(), options, pull_step, note);
}

}  // namespace sync
}  // namespace arc_v3

// Store events for the follow loop (src/sync/PROTOCOL.md, Pulling, "Told of a new step"):
// an HTTP endpoint that takes bucket notifications (radosgw's push endpoint; AWS S3 event
// notifications, bare or inside an SNS envelope) and wakes the loop when one names the
// store's `latest` or a step root. An event is a hint only: it triggers a poll, and nothing
// in it is read beyond the keys it names. Internal to src/sync (libmicrohttpd is linked by
// the sync layer only).
#ifndef ARC_V3_SRC_SYNC_EVENTS_H_
#define ARC_V3_SRC_SYNC_EVENTS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace sync {

// Where a store's keys appear in events: a bucket (empty: any) and the key prefix before
// the store's own keys ("" or "run7/").
struct EventSource {
  std::string bucket;
  std::string prefix;
};

// The places a store URL's keys may be named from: s3://B/P is bucket B, prefix "P/";
// http(s)://H/A/P is either bucket A, prefix "P/" (a path-style URL) or any bucket, prefix
// "A/P/" (a bucket's own host name, or a cache in front of it). None for other stores.
std::vector<EventSource> EventSourcesOf(const std::string& store_url);

// What a POSTed body asks for.
struct EventVerdict {
  enum class Kind {
    kWake,       // a record of a created object names `latest` or a step root of a source
    kIgnored,    // well-formed, but for other keys, buckets or kinds of event
    kMalformed,  // not JSON, or JSON of no known shape
    kSubscribe,  // an SNS SubscriptionConfirmation: `subscribe_url` confirms it
  };
  Kind kind = Kind::kIgnored;
  std::string subscribe_url;
};

// Reads a notification body: {"Records": [...]} (radosgw, S3), or an SNS envelope whose
// "Message" is such a body (other SNS messages are ignored). `watched` null: any created
// object wakes (the store is not known yet). Keys are percent-decoded, as S3 writes them.
EventVerdict ReadEvent(const std::string& body, const std::vector<EventSource>* watched);

// Whether `url` may be fetched to confirm an SNS subscription: https on port 443 of an
// sns.*.amazonaws.com(.cn) host. A forged confirmation can thus only subscribe this
// endpoint to an SNS topic, which sends nothing but more hints.
bool SnsConfirmable(const std::string& url);

// A listening endpoint. A body announced above kMaxEventBytes is answered 413 (one sent
// without a length is cut off there: the connection is closed), a malformed one 400, a
// method other than POST 405, the rest 200 (an SNS confirmation: 403 for a URL it does not
// fetch, 502 if the GET fails).
class EventListener {
 public:
  static constexpr size_t kMaxEventBytes = size_t{1} << 20;

  // Listens on "HOST:PORT" ("[V6]:PORT"; port 0: any free one, see port()).
  // kInvalidArgument for a malformed address or one that cannot be bound.
  static Status Start(const std::string& host_port, std::unique_ptr<EventListener>* listener);
  ~EventListener();
  EventListener(const EventListener&) = delete;
  EventListener& operator=(const EventListener&) = delete;

  // The store whose events wake (see EventSourcesOf); until set, any created object's.
  void Watch(const std::string& store_url);
  // Counts the events that woke so far: a loop notes it before a poll, and waits for it
  // to change after (so an event arriving during the poll is not lost).
  uint64_t wakes() const { return wakes_.load(); }
  // Sleeps until wakes() differs from `seen` (true) or `seconds` pass (false).
  bool WaitForWake(uint64_t seen, double seconds);
  uint16_t port() const { return port_; }

  // For the HTTP handler: the answer's status code for a complete body.
  unsigned Handle(const std::string& body);

 private:
  EventListener() = default;
  struct Daemon;
  std::unique_ptr<Daemon> daemon_;
  uint16_t port_ = 0;
  std::mutex mutex_;
  std::condition_variable woken_;
  std::atomic<uint64_t> wakes_{0};
  std::vector<EventSource> watched_;
  bool watching_ = false;
};

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_EVENTS_H_

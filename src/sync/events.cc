// The store events endpoint (events.h) over libmicrohttpd, a thread per connection (a
// confirmation's GET blocks only its own), bodies read with nlohmann-json.
#include "src/sync/events.h"

#include <curl/curl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

namespace arc_v3 {
namespace sync {
namespace {

using Json = nlohmann::json;

// The member `name` of object `o`, or null.
const Json* Member(const Json& o, const char* name) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(name);
  return it == o.end() ? nullptr : &*it;
}

const std::string* StringAt(const Json& o, std::initializer_list<const char*> path) {
  const Json* at = &o;
  for (const char* name : path) {
    at = Member(*at, name);
    if (at == nullptr) return nullptr;
  }
  return at->is_string() ? at->get_ptr<const std::string*>() : nullptr;
}

std::string Unescape(const std::string& text) {
  int length = 0;
  char* raw = curl_easy_unescape(nullptr, text.data(), static_cast<int>(text.size()), &length);
  if (raw == nullptr) return text;
  std::string out(raw, static_cast<size_t>(length));
  curl_free(raw);
  return out;
}

// `key` (relative to a store's prefix) is `latest` or a step root.
bool StepKey(const std::string& key) {
  if (key == "latest") return true;
  const std::string head = "steps/", tail = ".json";
  if (key.size() != head.size() + 12 + tail.size()) return false;
  if (key.compare(0, head.size(), head) != 0) return false;
  if (key.compare(head.size() + 12, tail.size(), tail) != 0) return false;
  for (size_t i = head.size(); i < head.size() + 12; ++i) {
    if (key[i] < '0' || key[i] > '9') return false;
  }
  return true;
}

bool Names(const Json& record, const std::vector<EventSource>* watched) {
  const std::string* name = StringAt(record, {"eventName"});
  const std::string* bucket = StringAt(record, {"s3", "bucket", "name"});
  const std::string* raw_key = StringAt(record, {"s3", "object", "key"});
  if (name == nullptr || name->find("ObjectCreated") == std::string::npos) return false;
  if (raw_key == nullptr) return false;
  if (watched == nullptr) return true;
  const std::string key = Unescape(*raw_key);
  for (const EventSource& source : *watched) {
    if (!source.bucket.empty() && (bucket == nullptr || *bucket != source.bucket)) continue;
    if (key.compare(0, source.prefix.size(), source.prefix) != 0) continue;
    if (StepKey(key.substr(source.prefix.size()))) return true;
  }
  return false;
}

EventVerdict ReadJson(const Json& j, const std::vector<EventSource>* watched, bool nested) {
  EventVerdict v;
  if (!j.is_object()) {
    v.kind = EventVerdict::Kind::kMalformed;
    return v;
  }
  const std::string* type = StringAt(j, {"Type"});
  if (type != nullptr && !nested) {  // an SNS envelope
    const std::string* url = StringAt(j, {"SubscribeURL"});
    const std::string* message = StringAt(j, {"Message"});
    if (*type == "SubscriptionConfirmation") {
      v.kind = url != nullptr ? EventVerdict::Kind::kSubscribe : EventVerdict::Kind::kMalformed;
      if (url != nullptr) v.subscribe_url = *url;
    } else if (*type == "Notification") {
      if (message == nullptr) {
        v.kind = EventVerdict::Kind::kMalformed;
        return v;
      }
      const Json inner = Json::parse(*message, nullptr, false);
      // An SNS topic may carry other messages than S3's: those are not ours to judge.
      if (!inner.is_discarded()) v = ReadJson(inner, watched, true);
      if (v.kind == EventVerdict::Kind::kMalformed) v.kind = EventVerdict::Kind::kIgnored;
    }
    return v;
  }
  const Json* records = Member(j, "Records");
  if (records == nullptr) return v;  // e.g. S3's s3:TestEvent
  if (!records->is_array()) {
    v.kind = EventVerdict::Kind::kMalformed;
    return v;
  }
  for (const Json& record : *records) {
    if (Names(record, watched)) v.kind = EventVerdict::Kind::kWake;
  }
  return v;
}

// GETs an SNS SubscribeURL; true on a 2xx answer.
bool Confirm(const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return false;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 20L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t n, void*) -> size_t {
        return size * n;  // the answer (a SubscriptionArn) is not needed
      });
  long code = 0;
  const bool ok = curl_easy_perform(curl) == CURLE_OK &&
                  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK;
  curl_easy_cleanup(curl);
  return ok && code >= 200 && code < 300;
}

struct Upload {
  std::string body;
};

MHD_Result Reply(MHD_Connection* connection, unsigned code) {
  const char* text = code == 200   ? "ok\n"
                     : code == 400 ? "not a bucket notification\n"
                     : code == 403 ? "not an SNS subscription this endpoint confirms\n"
                     : code == 405 ? "POST a bucket notification\n"
                     : code == 413 ? "body too large\n"
                                   : "confirmation failed\n";
  MHD_Response* response = MHD_create_response_from_buffer(
      std::strlen(text), const_cast<char*>(text), MHD_RESPMEM_PERSISTENT);
  if (response == nullptr) return MHD_NO;
  const MHD_Result r = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return r;
}

MHD_Result Access(void* cls, MHD_Connection* connection, const char* /*url*/, const char* method,
                  const char* /*version*/, const char* data, size_t* size, void** state) {
  auto* listener = static_cast<EventListener*>(cls);
  if (*state == nullptr) {
    if (std::strcmp(method, MHD_HTTP_METHOD_POST) != 0) return Reply(connection, 405);
    const char* length =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length != nullptr && std::strtoull(length, nullptr, 10) > EventListener::kMaxEventBytes) {
      return Reply(connection, 413);
    }
    *state = new Upload;
    return MHD_YES;
  }
  auto* upload = static_cast<Upload*>(*state);
  if (*size > 0) {
    // Past the bound with no length announced: an answer cannot be queued while the body
    // comes in, so the connection is closed rather than read on.
    if (upload->body.size() + *size > EventListener::kMaxEventBytes) return MHD_NO;
    upload->body.append(data, *size);
    *size = 0;
    return MHD_YES;
  }
  return Reply(connection, listener->Handle(upload->body));
}

void Completed(void* /*cls*/, MHD_Connection* /*connection*/, void** state,
               MHD_RequestTerminationCode /*why*/) {
  delete static_cast<Upload*>(*state);
  *state = nullptr;
}

}  // namespace

struct EventListener::Daemon {
  MHD_Daemon* daemon = nullptr;
  ~Daemon() {
    if (daemon != nullptr) MHD_stop_daemon(daemon);
  }
};

std::vector<EventSource> EventSourcesOf(const std::string& store_url) {
  const auto strip = [](std::string path) {
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    while (!path.empty() && path.back() == '/') path.pop_back();
    return path;
  };
  const auto dir = [](const std::string& path) { return path.empty() ? path : path + "/"; };
  if (store_url.compare(0, 5, "s3://") == 0) {
    const std::string rest = store_url.substr(5);
    const size_t slash = rest.find('/');
    const std::string prefix = slash == std::string::npos ? "" : strip(rest.substr(slash));
    return {{rest.substr(0, slash), dir(prefix)}};
  }
  if (store_url.compare(0, 7, "http://") != 0 && store_url.compare(0, 8, "https://") != 0) {
    return {};
  }
  CURLU* url = curl_url();
  char* raw = nullptr;
  std::string path;
  if (curl_url_set(url, CURLUPART_URL, store_url.c_str(), 0) == CURLUE_OK &&
      curl_url_get(url, CURLUPART_PATH, &raw, CURLU_URLDECODE) == CURLUE_OK) {
    path = strip(raw);
  }
  curl_free(raw);
  curl_url_cleanup(url);
  const size_t slash = path.find('/');
  if (path.empty()) return {{"", ""}};
  return {{path.substr(0, slash), slash == std::string::npos ? "" : dir(path.substr(slash + 1))},
          {"", dir(path)}};
}

EventVerdict ReadEvent(const std::string& body, const std::vector<EventSource>* watched) {
  const Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    EventVerdict v;
    v.kind = EventVerdict::Kind::kMalformed;
    return v;
  }
  return ReadJson(j, watched, false);
}

bool SnsConfirmable(const std::string& subscribe_url) {
  CURLU* url = curl_url();
  char *scheme = nullptr, *host = nullptr, *port = nullptr, *user = nullptr;
  bool ok = curl_url_set(url, CURLUPART_URL, subscribe_url.c_str(), 0) == CURLUE_OK &&
            curl_url_get(url, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
            curl_url_get(url, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
            curl_url_get(url, CURLUPART_USER, &user, 0) == CURLUE_NO_USER &&
            curl_url_get(url, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK;
  if (ok) {
    const std::string h = host;
    const auto ends = [&](const std::string& tail) {
      return h.size() > tail.size() && h.compare(h.size() - tail.size(), tail.size(), tail) == 0;
    };
    ok = std::strcmp(scheme, "https") == 0 && std::strcmp(port, "443") == 0 &&
         h.compare(0, 4, "sns.") == 0 && (ends(".amazonaws.com") || ends(".amazonaws.com.cn"));
  }
  for (char* part : {scheme, host, port, user}) curl_free(part);
  curl_url_cleanup(url);
  return ok;
}

Status EventListener::Start(const std::string& host_port, std::unique_ptr<EventListener>* out) {
  const size_t colon = host_port.rfind(':');
  std::string host = colon == std::string::npos ? "" : host_port.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto bad = [&](const std::string& why) {
    return Status(ErrorCode::kInvalidArgument,
                  "cannot listen for store events on '" + host_port + "': " + why);
  };
  if (host.empty() || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
    return bad("expected HOST:PORT");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) return bad(gai_strerror(gai));
  std::unique_ptr<EventListener> listener(new EventListener());
  listener->daemon_.reset(new Daemon);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
  if (found->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  errno = 0;
  listener->daemon_->daemon = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &Access, listener.get(), MHD_OPTION_SOCK_ADDR, found->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
      MHD_OPTION_NOTIFY_COMPLETED, &Completed, nullptr, MHD_OPTION_END);
  const int error = errno;
  freeaddrinfo(found);
  if (listener->daemon_->daemon == nullptr) {
    return bad(error != 0 ? std::strerror(error) : "the HTTP server did not start");
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(listener->daemon_->daemon, MHD_DAEMON_INFO_BIND_PORT);
  listener->port_ = info != nullptr ? info->port : 0;
  *out = std::move(listener);
  return Status::Ok();
}

EventListener::~EventListener() {
  daemon_.reset();  // no handler runs after this: the members it uses are still alive
}

void EventListener::Watch(const std::string& store_url) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_ = EventSourcesOf(store_url);
  watching_ = true;
}

bool EventListener::WaitForWake(uint64_t seen, double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  return woken_.wait_for(lock, std::chrono::duration<double>(seconds),
                         [&] { return wakes_.load() != seen; });
}

unsigned EventListener::Handle(const std::string& body) {
  std::vector<EventSource> watched;
  bool watching = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watched = watched_;
    watching = watching_;
  }
  const EventVerdict v = ReadEvent(body, watching ? &watched : nullptr);
  if (v.kind == EventVerdict::Kind::kMalformed) return 400;
  if (v.kind == EventVerdict::Kind::kSubscribe) {
    if (!SnsConfirmable(v.subscribe_url)) return 403;
    return Confirm(v.subscribe_url) ? 200 : 502;
  }
  if (v.kind == EventVerdict::Kind::kWake) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++wakes_;
    woken_.notify_all();
  }
  return 200;
}

}  // namespace sync
}  // namespace arc_v3

// The store events endpoint (src/sync/events.h): which bodies wake a follow loop, and the
// listener over real HTTP (libcurl posting to it on loopback): malformed and oversized
// bodies, other methods, events for other keys and buckets, SNS envelopes.
#include <curl/curl.h>

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "src/sync/events.h"

namespace arc_v3 {
namespace sync {
namespace {

// A record as radosgw 16.2 pushes it (trimmed of fields nothing reads).
std::string Record(const std::string& bucket, const std::string& key,
                   const std::string& name = "ObjectCreated:Put") {
  return R"({"eventVersion":"2.2","eventSource":"ceph:s3","eventName":")" + name +
         R"(","s3":{"s3SchemaVersion":"1.0","bucket":{"name":")" + bucket +
         R"(","arn":"arn:aws:s3:::)" + bucket + R"("},"object":{"key":")" + key +
         R"(","size":40,"eTag":"764efa883dda1e11db47671c4a3bbd9e"}}})";
}

std::string Records(const std::vector<std::string>& records) {
  std::string out = R"({"Records":[)";
  for (size_t i = 0; i < records.size(); ++i) out += (i ? "," : "") + records[i];
  return out + "]}";
}

// An SNS HTTP(S) delivery of `message` (a JSON string's contents, escaped here).
std::string Sns(const std::string& type, const std::string& message,
                const std::string& extra = "") {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return R"({"Type":")" + type + R"(","MessageId":"5b2d","TopicArn":"arn:aws:sns:us-east-1:1:t",)" +
         R"("Message":")" + escaped + R"(","Timestamp":"2026-12-07T21:00:00.000Z")" + extra + "}";
}

EventVerdict::Kind Read(const std::string& body, const std::string& store) {
  const std::vector<EventSource> watched = EventSourcesOf(store);
  return ReadEvent(body, &watched).kind;
}

using K = EventVerdict::Kind;

TEST_CASE("events: a created `latest` or step root of the store wakes, nothing else") {
  const std::string store = "s3://bucket/run7";
  CHECK(Read(Records({Record("bucket", "run7/latest")}), store) == K::kWake);
  CHECK(Read(Records({Record("bucket", "run7/steps/000000000011.json")}), store) == K::kWake);
  CHECK(Read(Records({Record("bucket", "run7/latest", "s3:ObjectCreated:Put")}), store) ==
        K::kWake);
  CHECK(Read(Records({Record("bucket", "run7/latest", "ObjectCreated:CompleteMultipartUpload")}),
             store) == K::kWake);
  // S3 percent-encodes keys in events.
  CHECK(Read(Records({Record("bucket", "run7%2Flatest")}), store) == K::kWake);
  // Another key, prefix, bucket or kind of event: well-formed, and ignored.
  CHECK(Read(Records({Record("bucket", "run7/steps/11.json")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("bucket", "run7/o/63/x/delta-1.a3d")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("bucket", "run8/latest")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("bucket", "run7/latest.tmp")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("bucket", "latest")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("other", "run7/latest")}), store) == K::kIgnored);
  CHECK(Read(Records({Record("bucket", "run7/latest", "ObjectRemoved:Delete")}), store) ==
        K::kIgnored);
  CHECK(Read(Records({}), store) == K::kIgnored);
  CHECK(Read(R"({"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"bucket"})", store) ==
        K::kIgnored);
  // One matching record among others is enough.
  CHECK(Read(Records({Record("other", "x"), "17", Record("bucket", "run7/latest")}), store) ==
        K::kWake);
  // A store at the bucket's root.
  CHECK(Read(Records({Record("bucket", "latest")}), "s3://bucket") == K::kWake);
  CHECK(Read(Records({Record("bucket", "run7/latest")}), "s3://bucket/") == K::kIgnored);
}

TEST_CASE("events: malformed bodies") {
  const std::string store = "s3://bucket/run7";
  for (const std::string body : {"", "{", "not json", "[1,2]", "\"Records\"", "17",
                                 R"({"Records":{"s3":1}})", R"({"Records":"x"})"}) {
    CAPTURE(body);
    CHECK(Read(body, store) == K::kMalformed);
  }
  // Deep nesting parses without harm (and names nothing).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK(Read(deep, store) == K::kMalformed);
  const std::string deep_record =
      R"({"Records":[)" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  CHECK(Read(deep_record, store) == K::kIgnored);
  // Fields of the wrong types are ignored, not trusted and not a crash.
  CHECK(Read(R"({"Records":[{"eventName":1,"s3":{"bucket":{"name":"bucket"},)"
             R"("object":{"key":"run7/latest"}}}]})",
             store) == K::kIgnored);
  CHECK(Read(R"({"Records":[{"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"bucket"},)"
             R"("object":{"key":7}}}]})",
             store) == K::kIgnored);
  CHECK(Read(R"({"Records":[{"eventName":"ObjectCreated:Put","s3":[]}]})", store) == K::kIgnored);
}

TEST_CASE("events: SNS envelopes") {
  const std::string store = "s3://bucket/run7";
  CHECK(Read(Sns("Notification", Records({Record("bucket", "run7/latest")})), store) == K::kWake);
  CHECK(Read(Sns("Notification", Records({Record("bucket", "run8/latest")})), store) ==
        K::kIgnored);
  // Another publisher's message on the topic: not S3's, ignored.
  CHECK(Read(Sns("Notification", "hello"), store) == K::kIgnored);
  CHECK(Read(R"({"Type":"Notification"})", store) == K::kMalformed);
  // An envelope inside an envelope is not unwrapped twice.
  CHECK(Read(Sns("Notification", Sns("Notification", Records({Record("bucket", "run7/latest")}))),
             store) == K::kIgnored);
  const std::string url =
      "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=t&Token=x";
  const std::vector<EventSource> watched = EventSourcesOf(store);
  const EventVerdict v = ReadEvent(
      Sns("SubscriptionConfirmation", "confirm", R"(,"SubscribeURL":")" + url + "\""), &watched);
  CHECK(v.kind == K::kSubscribe);
  CHECK(v.subscribe_url == url);
  CHECK(Read(Sns("SubscriptionConfirmation", "confirm"), store) == K::kMalformed);
  CHECK(Read(Sns("UnsubscribeConfirmation", "bye"), store) == K::kIgnored);
}

TEST_CASE("events: only SNS's own hosts are fetched to confirm") {
  CHECK(SnsConfirmable("https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=x"));
  CHECK(SnsConfirmable("https://sns.cn-north-1.amazonaws.com.cn/?Action=ConfirmSubscription"));
  CHECK_FALSE(SnsConfirmable("http://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription"));
  CHECK_FALSE(SnsConfirmable("https://sns.us-east-1.amazonaws.com:8443/"));
  CHECK_FALSE(SnsConfirmable("https://sns.us-east-1.amazonaws.com.evil.example/"));
  CHECK_FALSE(SnsConfirmable("https://evil.example/sns.us-east-1.amazonaws.com/"));
  CHECK_FALSE(SnsConfirmable("https://user@sns.us-east-1.amazonaws.com/"));
  CHECK_FALSE(SnsConfirmable("https://s3.us-east-1.amazonaws.com/"));
  CHECK_FALSE(SnsConfirmable("https://127.0.0.1/"));
  CHECK_FALSE(SnsConfirmable("file:///etc/passwd"));
  CHECK_FALSE(SnsConfirmable("not a url"));
}

TEST_CASE("events: where a store URL's keys appear") {
  const auto sources = [](const std::string& url) {
    std::vector<std::string> out;
    for (const EventSource& s : EventSourcesOf(url)) out.push_back(s.bucket + "|" + s.prefix);
    return out;
  };
  CHECK(sources("s3://b/run7") == std::vector<std::string>{"b|run7/"});
  CHECK(sources("s3://b/a/run7/") == std::vector<std::string>{"b|a/run7/"});
  CHECK(sources("s3://b") == std::vector<std::string>{"b|"});
  CHECK(sources("http://127.0.0.1:7740/b/run7") == std::vector<std::string>{"b|run7/", "|b/run7/"});
  CHECK(sources("https://cdn.example/b") == std::vector<std::string>{"b|", "|b/"});
  CHECK(sources("https://b.s3.amazonaws.com") == std::vector<std::string>{"|"});
  CHECK(sources("/tmp/store").empty());
  CHECK(sources("file:///tmp/store").empty());
}

// POSTs (or `method`s) `body` to the listener; the HTTP status, -1 if the listener closed
// the connection while the body was still being sent, 0 if the request failed otherwise.
// `chunked`: without a Content-Length, so that only the bytes read can tell the size.
long Post(uint16_t port, const std::string& body, const char* method = "POST",
          bool chunked = false) {
  CURL* curl = curl_easy_init();
  REQUIRE(curl != nullptr);
  curl_slist* headers =
      chunked ? curl_slist_append(nullptr, "Transfer-Encoding: chunked") : nullptr;
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  if (std::string(method) != "GET") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION,
      +[](char*, size_t size, size_t n, void*) -> size_t { return size * n; });
  long code = 0;
  const CURLcode r = curl_easy_perform(curl);
  if (r == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  if (r == CURLE_SEND_ERROR || r == CURLE_RECV_ERROR || r == CURLE_GOT_NOTHING) code = -1;
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  return code;
}

TEST_CASE("events: the listener over HTTP") {
  std::unique_ptr<EventListener> listener;
  REQUIRE(EventListener::Start("127.0.0.1:0", &listener).ok());
  const uint16_t port = listener->port();
  REQUIRE(port != 0);
  listener->Watch("s3://bucket/run7");
  uint64_t seen = listener->wakes();
  CHECK_FALSE(listener->WaitForWake(seen, 0.05));

  CHECK(Post(port, "not json") == 400);
  CHECK(Post(port, Records({Record("bucket", "run8/latest")})) == 200);
  CHECK(Post(port, Records({Record("other", "run7/latest")})) == 200);
  CHECK(Post(port, "", "GET") == 405);
  CHECK(Post(port, Records({Record("bucket", "run7/latest")}), "PUT") == 405);
  // Over 1 MiB (a matching record padded with spaces): refused, and it wakes nothing.
  std::string big = Records({Record("bucket", "run7/latest")});
  big += std::string(EventListener::kMaxEventBytes, ' ');
  CHECK(Post(port, big) == 413);
  // Without a length, the listener closes the connection once it has read 1 MiB.
  CHECK(Post(port, big, "POST", true) == -1);
  CHECK(Post(port, Records({Record("bucket", "run8/latest")}), "POST", true) == 200);
  // A confirmation whose URL is not SNS's is not fetched.
  CHECK(Post(port, Sns("SubscriptionConfirmation", "c",
                       R"(,"SubscribeURL":"http://127.0.0.1:)" + std::to_string(port) + "/\"")) ==
        403);
  CHECK(listener->wakes() == seen);

  CHECK(Post(port, Records({Record("bucket", "run7/latest")})) == 200);
  CHECK(listener->WaitForWake(seen, 10));
  CHECK(listener->wakes() == seen + 1);
  seen = listener->wakes();
  const std::string root = Records({Record("bucket", "run7/steps/000000000012.json")});
  CHECK(Post(port, Sns("Notification", root)) == 200);
  CHECK(listener->WaitForWake(seen, 10));
  // Just under the bound is still read.
  std::string padded = Records({Record("bucket", "run7/latest")});
  padded += std::string(EventListener::kMaxEventBytes - padded.size(), ' ');
  seen = listener->wakes();
  CHECK(Post(port, padded) == 200);
  CHECK(listener->wakes() == seen + 1);

  // A local store: no event names it.
  listener->Watch("/tmp/store");
  seen = listener->wakes();
  CHECK(Post(port, Records({Record("bucket", "latest")})) == 200);
  CHECK(listener->wakes() == seen);
}

TEST_CASE("events: addresses the listener refuses") {
  std::unique_ptr<EventListener> listener;
  REQUIRE(EventListener::Start("127.0.0.1:0", &listener).ok());
  const std::string taken = "127.0.0.1:" + std::to_string(listener->port());
  std::unique_ptr<EventListener> second;
  const Status busy = EventListener::Start(taken, &second);
  CHECK(busy.code() == ErrorCode::kInvalidArgument);
  CHECK(busy.message().find(taken) != std::string::npos);
  for (const std::string bad : {"", "7750", "127.0.0.1", "127.0.0.1:", ":7750", "127.0.0.1:x",
                                "127.0.0.1:99999", "127.0.0.1:-1"}) {
    CAPTURE(bad);
    CHECK(EventListener::Start(bad, &second).code() == ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3

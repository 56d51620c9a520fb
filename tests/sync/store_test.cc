// The stores, each against a real backend: a directory, and radosgw (Ceph's S3 gateway,
// booted by tests/run_tests.sh) for s3:// and for the read-only http:// store.
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "src/sync/s3_answers.h"
#include "src/sync/store.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::TempDir;

std::vector<uint8_t> Bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Sets environment variables for the lifetime of the object (to open stores with other
// credentials or endpoints), restoring them after.
class ScopedEnv {
 public:
  void Set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_CASE("stores: put, get, ranges, heads, conditional gets, lists and deletes") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "basic")) {
    INFO("store ", b.name, " ", b.url);
    Store& s = *b.store;
    const std::vector<uint8_t> a = Bytes("first version"), c = Bytes("second, longer version");
    REQUIRE(s.Put("dir/one.json", a.data(), a.size(), PutMode::kOverwrite).ok());
    std::vector<uint8_t> got;
    ObjectInfo info;
    REQUIRE(s.Get("dir/one.json", 1 << 20, &got, &info).ok());
    CHECK(got == a);
    CHECK(info.size == a.size());
    CHECK(!info.etag.empty());

    // Conditional get: unchanged, then changed by an overwrite.
    bool changed = true;
    std::vector<uint8_t> untouched = Bytes("keep");
    REQUIRE(s.GetIfChanged("dir/one.json", info.etag, 1 << 20, &untouched, nullptr, &changed).ok());
    CHECK(!changed);
    CHECK(untouched == Bytes("keep"));
    REQUIRE(s.Put("dir/one.json", c.data(), c.size(), PutMode::kOverwrite).ok());
    ObjectInfo info2;
    REQUIRE(s.GetIfChanged("dir/one.json", info.etag, 1 << 20, &got, &info2, &changed).ok());
    CHECK(changed);
    CHECK(got == c);
    CHECK(info2.etag != info.etag);

    // Ranges and heads.
    uint8_t part[6];
    REQUIRE(s.GetRange("dir/one.json", 8, 6, part).ok());
    CHECK(std::string(part, part + 6) == "longer");
    CHECK(s.GetRange("dir/one.json", 20, 10, part).code() == ErrorCode::kTruncated);
    REQUIRE(s.Head("dir/one.json", &info).ok());
    CHECK(info.size == c.size());

    // Write-once.
    const Status again = s.Put("dir/one.json", a.data(), a.size(), PutMode::kCreateOnly);
    CHECK(again.code() == ErrorCode::kAlreadyExists);
    REQUIRE(s.Get("dir/one.json", 1 << 20, &got, nullptr).ok());
    CHECK(got == c);
    REQUIRE(s.Put("dir/two.json", a.data(), a.size(), PutMode::kCreateOnly).ok());

    // Missing objects name their key; oversized answers are refused; keys are checked.
    const Status missing = s.Get("dir/none.json", 1 << 20, &got, nullptr);
    CHECK(missing.code() == ErrorCode::kNotFound);
    CHECK(missing.message().find("dir/none.json") != std::string::npos);
    CHECK(s.Head("dir/none.json", &info).code() == ErrorCode::kNotFound);
    CHECK(s.Get("dir/one.json", 4, &got, nullptr).code() == ErrorCode::kCorruptHeader);
    for (const char* bad : {"", "/abs", "a/../b", "a//b", "a b", "x/./y", "."}) {
      CHECK(s.Put(bad, a.data(), a.size(), PutMode::kOverwrite).code() ==
            ErrorCode::kInvalidArgument);
    }

    // Listing: sorted, by prefix, sizes.
    REQUIRE(s.Put("dir/sub/three", a.data(), a.size(), PutMode::kOverwrite).ok());
    REQUIRE(s.Put("other", a.data(), 0, PutMode::kOverwrite).ok());
    std::vector<ObjectInfo> list;
    REQUIRE(s.List("dir/", &list).ok());
    REQUIRE(list.size() == 3);
    CHECK(list[0].key == "dir/one.json");
    CHECK(list[1].key == "dir/sub/three");
    CHECK(list[2].key == "dir/two.json");
    CHECK(list[0].size == c.size());
    REQUIRE(s.List("", &list).ok());
    CHECK(list.size() == 4);

    // Deleting, also what is not there.
    REQUIRE(s.Delete("dir/two.json").ok());
    CHECK(s.Delete("dir/two.json").ok());
    CHECK(s.Head("dir/two.json", &info).code() == ErrorCode::kNotFound);
  }
}

TEST_CASE("stores: big objects go up in parallel parts and come down in parallel ranges") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "big")) {
    INFO("store ", b.name);
    StoreOptions o = test::FastRetries();                             // 5 MiB parts
    const std::vector<uint8_t> big = Random((12u << 20) + 12345, 7);  // three parts
    test::WriteBytes(tmp / "big.bin", big);
    REQUIRE(b.store->PutFile("big/object", tmp / "big.bin", PutMode::kOverwrite).ok());
    ObjectInfo info;
    REQUIRE(b.store->Head("big/object", &info).ok());
    CHECK(info.size == big.size());
    REQUIRE(b.store->GetToFile("big/object", tmp / "down.bin", UINT64_MAX, o).ok());
    CHECK(test::ReadBytes(tmp / "down.bin") == big);
    std::vector<uint8_t> middle(1000);
    REQUIRE(b.store->GetRange("big/object", (5u << 20) - 500, middle.size(), middle.data()).ok());
    CHECK(std::equal(middle.begin(), middle.end(), big.begin() + (5u << 20) - 500));
    // Write-once of a multipart object: refused where the key exists.
    CHECK(b.store->PutFile("big/object", tmp / "big.bin", PutMode::kCreateOnly).code() ==
          ErrorCode::kAlreadyExists);
    // A download of an object that is shorter than expected fails and leaves no file.
    CHECK(b.store->GetToFile("big/object", tmp / "short.bin", big.size() + 10, o).code() ==
          ErrorCode::kTruncated);
    CHECK(!test::fs::exists(tmp / "short.bin"));
  }
}

TEST_CASE("stores: of writers racing to create one key, exactly one wins") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "race")) {
    INFO("store ", b.name);
    constexpr int kWriters = 8;
    std::vector<Status> results(kWriters);
    std::vector<std::thread> threads;
    for (int i = 0; i < kWriters; ++i) {
      threads.emplace_back([&, i] {
        const std::vector<uint8_t> mine = Bytes("writer " + std::to_string(i));
        results[i] =
            b.store->Put("race/manifest.json", mine.data(), mine.size(), PutMode::kCreateOnly);
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0, winner = -1;
    for (int i = 0; i < kWriters; ++i) {
      if (results[i].ok()) {
        ++winners;
        winner = i;
      } else {
        CHECK(results[i].code() == ErrorCode::kAlreadyExists);
      }
    }
    REQUIRE(winners == 1);
    std::vector<uint8_t> got;
    REQUIRE(b.store->Get("race/manifest.json", 1 << 20, &got, nullptr).ok());
    CHECK(got == Bytes("writer " + std::to_string(winner)));
  }
}

TEST_CASE("stores: a store that is gone fails with unavailable after its retries, naming the key") {
  TempDir tmp;
  {
    // The local store's directory disappears.
    std::unique_ptr<Store> store;
    test::fs::create_directories(tmp / "gone");
    REQUIRE(OpenStore(tmp / "gone", test::FastRetries(), &store).ok());
    test::fs::remove_all(tmp / "gone");
    std::vector<uint8_t> got;
    const Status s = store->Get("latest", 1 << 20, &got, nullptr);
    CHECK(s.code() == ErrorCode::kUnavailable);
    CHECK(store->Put("x", got.data(), 0, PutMode::kOverwrite).code() == ErrorCode::kUnavailable);
    // Never there: a reader is told nothing was published; a writer (create) makes it,
    // but a store that went away after opening is never re-created.
    const Status never = OpenStore(tmp / "never", test::FastRetries(), &store);
    CHECK(never.code() == ErrorCode::kNotFound);
    CHECK(never.message().find("does not exist") != std::string::npos);
    CHECK(!test::fs::exists(tmp / "never"));
    StoreOptions create = test::FastRetries();
    create.create = true;
    REQUIRE(OpenStore(tmp / "never/nested", create, &store).ok());
    CHECK(test::fs::is_directory(tmp / "never/nested"));
    CHECK(store->Put("x", got.data(), 0, PutMode::kOverwrite).ok());
    std::ofstream(tmp / "a-file") << "x";
    CHECK(OpenStore(tmp / "a-file", create, &store).code() == ErrorCode::kInvalidArgument);
  }
  {
    // Nothing listens on the endpoint.
    ScopedEnv env;
    env.Set("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
    env.Set("AWS_ENDPOINT_URL_S3", nullptr);
    std::unique_ptr<Store> store;
    REQUIRE(OpenStore("s3://bucket/prefix", test::FastRetries(), &store).ok());
    const auto start = std::chrono::steady_clock::now();
    std::vector<uint8_t> got;
    const Status s = store->Get("steps/000000000001/manifest.json", 1 << 20, &got, nullptr);
    CHECK(s.code() == ErrorCode::kUnavailable);
    CHECK(s.message().find("s3://bucket/prefix/steps/000000000001/manifest.json") !=
          std::string::npos);
    CHECK(s.message().find("3 times") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
}

// An HTTP server on loopback that gives every request the same answer (a server, proxy or
// CDN that misbehaves), closing the connection after it.
class FixedAnswerServer {
 public:
  explicit FixedAnswerServer(std::string answer) : answer_(std::move(answer)) {
    listener_ = test::ListenOnLoopback(16, &port_);
    thread_ = std::thread([this] {
      for (;;) {
        const int client = accept(listener_, nullptr, nullptr);
        if (client < 0) return;
        char request[8192];
        std::string head;
        while (head.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = read(client, request, sizeof(request));
          if (n <= 0) break;
          head.append(request, static_cast<size_t>(n));
        }
        (void)!send(client, answer_.data(), answer_.size(), MSG_NOSIGNAL);
        shutdown(client, SHUT_RDWR);
        close(client);
      }
    });
  }
  ~FixedAnswerServer() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string answer_;
  int listener_ = -1, port_ = 0;
  std::thread thread_;
};

TEST_CASE("stores: an answer other than the one asked for is refused, not taken") {
  StoreOptions options = test::FastRetries();
  std::unique_ptr<Store> store;
  {
    // A 206 of another range than asked for (a proxy that merges or shifts ranges).
    FixedAnswerServer server(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\nContent-Length: 10\r\n"
        "Connection: close\r\n\r\n0123456789");
    REQUIRE(NewHttpStore(server.url(), options, &store).ok());
    std::vector<uint8_t> out(10, 0xEE);
    const Status s = store->GetRange("steps/x", 50, 10, out.data());
    CHECK(s.code() == ErrorCode::kUnavailable);
    CHECK(s.message().find("Content-Range") != std::string::npos);
    CHECK(out == std::vector<uint8_t>(10, 0xEE));
    // The same answer is the right one for bytes 0-9.
    CHECK(store->GetRange("steps/x", 0, 10, out.data()).ok());
    CHECK(std::string(out.begin(), out.end()) == "0123456789");
  }
  {
    // A HEAD answer without a size.
    FixedAnswerServer server("HTTP/1.1 200 OK\r\nETag: \"a\"\r\nConnection: close\r\n\r\n");
    REQUIRE(NewHttpStore(server.url(), options, &store).ok());
    ObjectInfo info;
    const Status s = store->Head("latest", &info);
    CHECK(s.code() == ErrorCode::kUnavailable);
    CHECK(s.message().find("Content-Length") != std::string::npos);
  }
}

TEST_CASE("stores: S3 answers as radosgw writes them, and what is refused of them") {
  // Captured from radosgw (tests/fuzz/corpus/s3_answers holds the same answers whole).
  const std::string listing =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult "
      "xmlns=\"http://s3.amazonaws.com/doc/"
      "2006-03-01/\"><Name>arc-v3-test</Name><Prefix>seed/runs/a</Prefix><MaxKeys>1</"
      "MaxKeys><IsTruncated>"
      "true</IsTruncated><Contents><Key>seed/runs/a/latest</Key><ETag>&quot;0ab63eb8&quot;</"
      "ETag><Size>12"
      "</Size></Contents><Contents><Key>seed/runs/ab/latest</Key><Size>1</Size></Contents>"
      "<NextContinuationToken>seed/runs/a/latest</NextContinuationToken></ListBucketResult>";
  ListingPage page;
  REQUIRE(ParseListing(listing.data(), listing.size(), "seed/runs/a", "s3://b", &page).ok());
  REQUIRE(page.objects.size() == 1);  // seed/runs/ab/ is another prefix's
  CHECK(page.objects[0].key == "latest");
  CHECK(page.objects[0].size == 12);
  CHECK(page.objects[0].etag == "\"0ab63eb8\"");
  CHECK(page.truncated);
  CHECK(page.next_token == "seed/runs/a/latest");
  const std::string bad_size =
      "<ListBucketResult><Contents><Key>k</Key><Size>12x</Size></Contents></ListBucketResult>";
  CHECK(ParseListing(bad_size.data(), bad_size.size(), "", "s3://b", &page).code() ==
        ErrorCode::kUnavailable);
  const std::string no_token =
      "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
  CHECK(ParseListing(no_token.data(), no_token.size(), "", "s3://b", &page).code() ==
        ErrorCode::kUnavailable);
  const std::string error = "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
  CHECK(S3ErrorText(error.data(), error.size()) == "NoSuchKey: gone");
  CHECK(S3ErrorText("<Error", 6).empty());

  AnswerHeaders h;
  for (const char* line :
       {"HTTP/1.1 206 Partial Content\r\n", "Content-Range: bytes 4990-4999/5000\r\n",
        "ETag: \"70ea\"\r\n", "Content-Length: 10\r\n"}) {
    ParseHeaderLine(line, std::strlen(line), &h);
  }
  CHECK(h.etag == "\"70ea\"");
  CHECK(h.content_length == 10);
  CHECK(RangeMatches(h, 4990, 111));  // to the object's end
  CHECK(!RangeMatches(h, 4990, 5));   // longer than asked for
  CHECK(!RangeMatches(h, 4980, 20));  // elsewhere
  for (const char* line :
       {"Content-Length: 12 34\r\n", "Content-Range: bytes 9-3/5000\r\n", "ETag: \"a\x01\"\r\n"}) {
    ParseHeaderLine(line, std::strlen(line), &h);
  }
  CHECK(h.content_length == UINT64_MAX);
  CHECK(h.range_malformed);
  CHECK(h.etag.empty());
  ParseHeaderLine("HTTP/1.1 200 OK", 15, &h);  // a new answer forgets the last one's fields
  CHECK(!h.has_range);
}

TEST_CASE("stores: wrong credentials are permission_denied, naming the key") {
  const std::string bucket = test::S3Bucket();
  if (bucket.empty()) return;
  ScopedEnv env;
  env.Set("AWS_SECRET_ACCESS_KEY", "not-the-secret");
  std::unique_ptr<Store> store;
  REQUIRE(OpenStore(bucket + "/creds", test::FastRetries(), &store).ok());
  std::vector<uint8_t> got;
  const Status s = store->Get("latest", 1 << 20, &got, nullptr);
  CHECK(s.code() == ErrorCode::kPermissionDenied);
  CHECK(s.message().find("creds/latest") != std::string::npos);
  const std::vector<uint8_t> a = Bytes("x");
  CHECK(store->Put("latest", a.data(), a.size(), PutMode::kOverwrite).code() ==
        ErrorCode::kPermissionDenied);
  env.Set("AWS_ACCESS_KEY_ID", "nobody");
  REQUIRE(OpenStore(bucket + "/creds", test::FastRetries(), &store).ok());
  ObjectInfo info;
  CHECK(store->Head("latest", &info).code() == ErrorCode::kPermissionDenied);
}

TEST_CASE("stores: a read-only http store reads what was published to the bucket behind it") {
  const std::string bucket = test::Env("ARC_V3_TEST_PUBLIC_S3"),
                    http = test::Env("ARC_V3_TEST_PUBLIC_HTTP");
  if (test::S3Bucket().empty()) return;
  REQUIRE(!bucket.empty());
  REQUIRE(!http.empty());
  const std::string prefix = test::UniqueName("http");
  std::unique_ptr<Store> s3, web;
  REQUIRE(OpenStore(bucket + "/" + prefix, test::FastRetries(), &s3).ok());
  const std::vector<uint8_t> data = Random(100000, 3);
  REQUIRE(s3->Put("steps/a.bin", data.data(), data.size(), PutMode::kOverwrite).ok());
  ScopedEnv env;  // anonymous, as a CDN's users are
  env.Set("AWS_ACCESS_KEY_ID", nullptr);
  env.Set("AWS_SECRET_ACCESS_KEY", nullptr);
  REQUIRE(OpenStore(http + "/" + prefix, test::FastRetries(), &web).ok());
  CHECK(!web->writable());
  CHECK(!web->listable());
  std::vector<uint8_t> got;
  ObjectInfo info;
  REQUIRE(web->Get("steps/a.bin", 1 << 20, &got, &info).ok());
  CHECK(got == data);
  bool changed = true;
  REQUIRE(web->GetIfChanged("steps/a.bin", info.etag, 1 << 20, &got, nullptr, &changed).ok());
  CHECK(!changed);
  std::vector<uint8_t> part(777);
  REQUIRE(web->GetRange("steps/a.bin", 4242, part.size(), part.data()).ok());
  CHECK(std::equal(part.begin(), part.end(), data.begin() + 4242));
  CHECK(web->Get("steps/none", 1 << 20, &got, nullptr).code() == ErrorCode::kNotFound);
  CHECK(web->Put("steps/b", data.data(), 1, PutMode::kOverwrite).code() ==
        ErrorCode::kInvalidArgument);
  std::vector<ObjectInfo> list;
  CHECK(web->List("", &list).code() == ErrorCode::kInvalidArgument);
}

// The Cache-Control header of a plain GET of `url` (libcurl, as any HTTP cache reads it);
// empty if the answer has none, "HTTP <status>" if it is not a 200.
std::string CacheControlOf(const std::string& url) {
  CURL* curl = curl_easy_init();
  REQUIRE(curl != nullptr);
  std::string headers;
  auto on_header = +[](char* data, size_t size, size_t count, void* out) -> size_t {
    static_cast<std::string*>(out)->append(data, size * count);
    return size * count;
  };
  auto on_body = +[](char*, size_t size, size_t count, void*) -> size_t { return size * count; };
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
  const CURLcode code = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  REQUIRE(code == CURLE_OK);
  if (status != 200) return "HTTP " + std::to_string(status);
  std::istringstream lines(headers);
  for (std::string line; std::getline(lines, line);) {
    const std::string name = "cache-control:";
    std::string lower = line.substr(0, name.size());
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower != name) continue;
    std::string value = line.substr(name.size());
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
    while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
    return value;
  }
  return "";
}

TEST_CASE("stores: S3 writes say what HTTP caches may keep: write-once for a year, latest never") {
  const std::string bucket = test::Env("ARC_V3_TEST_PUBLIC_S3");
  const std::string http = test::Env("ARC_V3_TEST_PUBLIC_HTTP");
  if (test::S3Bucket().empty()) return;
  REQUIRE(!bucket.empty());
  REQUIRE(!http.empty());
  TempDir tmp;
  const std::string prefix = test::UniqueName("cache");
  std::unique_ptr<Store> s3;
  REQUIRE(OpenStore(bucket + "/" + prefix, test::FastRetries(), &s3).ok());
  const std::vector<uint8_t> small = Random(1000, 5), big = Random((10u << 20) + 7, 6);
  test::WriteBytes(tmp / "big.bin", big);
  test::WriteBytes(tmp / "small.bin", small);
  REQUIRE(s3->Put("o/once.a3d", small.data(), small.size(), PutMode::kCreateOnly).ok());
  REQUIRE(s3->PutFile("o/file.a3d", tmp / "small.bin", PutMode::kCreateOnly).ok());
  REQUIRE(s3->PutFile("o/parts.a3d", tmp / "big.bin", PutMode::kCreateOnly).ok());  // multipart
  REQUIRE(s3->Put("latest", small.data(), small.size(), PutMode::kOverwrite).ok());
  REQUIRE(s3->PutFile("pointer", tmp / "small.bin", PutMode::kOverwrite).ok());
  REQUIRE(s3->PutFile("pointer.big", tmp / "big.bin", PutMode::kOverwrite).ok());  // multipart
  const std::string immutable = "public, max-age=31536000, immutable";
  const std::string base = http + "/" + prefix + "/";
  CHECK(CacheControlOf(base + "o/once.a3d") == immutable);
  CHECK(CacheControlOf(base + "o/file.a3d") == immutable);
  CHECK(CacheControlOf(base + "o/parts.a3d") == immutable);
  CHECK(CacheControlOf(base + "latest") == "no-cache");
  CHECK(CacheControlOf(base + "pointer") == "no-cache");
  CHECK(CacheControlOf(base + "pointer.big") == "no-cache");
  // An overwrite keeps saying no-cache.
  REQUIRE(s3->Put("latest", big.data(), 100, PutMode::kOverwrite).ok());
  CHECK(CacheControlOf(base + "latest") == "no-cache");
  for (const char* key :
       {"o/once.a3d", "o/file.a3d", "o/parts.a3d", "latest", "pointer", "pointer.big"}) {
    CHECK(s3->Delete(key).ok());
  }
}

TEST_CASE("stores: a registered scheme opens its own stores by URL") {
  TempDir tmp;
  std::string opened;
  REQUIRE(RegisterStoreScheme("arc-test+mem", [&](const std::string& url, const StoreOptions&,
                                                  std::unique_ptr<Store>* store) {
            opened = url;
            *store = NewLocalStore(tmp.path(), url);
            return Status::Ok();
          }).ok());
  std::unique_ptr<Store> store;
  REQUIRE(OpenStore("arc-test+mem://somewhere", StoreOptions(), &store).ok());
  CHECK(opened == "arc-test+mem://somewhere");
  const std::vector<uint8_t> bytes = Bytes("hello");
  REQUIRE(store->Put("k", bytes.data(), bytes.size(), PutMode::kOverwrite).ok());
  CHECK(test::ReadBytes(tmp / "k") == bytes);
  // Built-in schemes and malformed names cannot be registered; unknown schemes stay errors.
  for (const char* scheme : {"s3", "http", "https", "file", "", "9p", "a/b", "A"}) {
    CHECK(RegisterStoreScheme(scheme, nullptr).code() == ErrorCode::kInvalidArgument);
  }
  CHECK(OpenStore("arc-test+none://x", StoreOptions(), &store).code() ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("stores: URLs") {
  std::unique_ptr<Store> store;
  const StoreOptions o;
  CHECK(OpenStore("s3://", o, &store).code() == ErrorCode::kInvalidArgument);
  CHECK(OpenStore("s3://bucket/bad prefix", o, &store).code() == ErrorCode::kInvalidArgument);
  CHECK(OpenStore("ftp://host/x", o, &store).code() == ErrorCode::kInvalidArgument);
  REQUIRE(OpenStore("s3://bucket/run/7/", o, &store).ok());
  CHECK(store->url() == "s3://bucket/run/7/");
  TempDir tmp;
  REQUIRE(OpenStore("file://" + tmp.path(), o, &store).ok());
  CHECK(store->writable());
  CHECK(ValidKey("steps/000000000001/manifest.json"));
  CHECK(!ValidKey("steps//x"));
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3

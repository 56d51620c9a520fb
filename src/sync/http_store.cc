// The S3 and read-only HTTP stores, over libcurl. Requests to S3 are signed by libcurl
// itself (CURLOPT_AWS_SIGV4); this file builds canonical URLs (keys and query parameters
// percent-encoded, parameters sorted by name, as SigV4 wants them and as libcurl 7.88
// signs them verbatim), retries what may pass on a second try and names the key in every
// error. What it reads of the answers is parsed in s3_answers.cc.
#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "src/common/file_io.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/sync/s3_answers.h"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

struct Request {
  const char* method = "GET";
  std::string url;
  std::vector<std::string> headers;
  // Body: memory, or a range of a file.
  const uint8_t* body = nullptr;
  uint64_t body_size = 0;
  int body_fd = -1;
  uint64_t body_offset = 0;
  // Response body: into `out` (exactly `out_size` bytes expected, after skipping `skip`
  // bytes of a 200 answer to a range request), else into `out_vec` (at most `max_size`).
  uint8_t* out = nullptr;
  uint64_t out_size = 0;
  uint64_t range_offset = 0;
  bool range = false;
  std::vector<uint8_t>* out_vec = nullptr;
  uint64_t max_size = UINT64_MAX;
};

struct Response {
  long status = 0;
  AnswerHeaders headers;
  std::string error_body;    // the first 64 KB of a >= 300 answer
  uint64_t received = 0;     // body bytes kept
  bool overflow = false;     // more body than the request allows
  bool wrong_range = false;  // a 206 answer whose Content-Range is not the one asked for
};

// State of one transfer, for libcurl's callbacks.
struct Transfer {
  CURL* curl;
  const Request* request;
  Response* response;
  uint64_t sent = 0;
  uint64_t seen = 0;  // body bytes seen, kept or skipped
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  ParseHeaderLine(data, size * count, &t->response->headers);
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  Response* r = t->response;
  const Request* q = t->request;
  if (status >= 300) {
    const size_t keep =
        std::min<size_t>(n, (64u << 10) - std::min<size_t>(r->error_body.size(), 64u << 10));
    r->error_body.append(data, keep);
    return n;
  }
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(data);
  uint64_t length = n;
  if (q->out != nullptr) {
    if (q->range && status == 206 && t->seen == 0 &&
        !RangeMatches(r->headers, q->range_offset, q->out_size)) {
      r->wrong_range = true;
      return 0;
    }
    // A server that ignores Range answers 200 with the whole object: skip to the range.
    const uint64_t skip = (q->range && status == 200) ? q->range_offset : 0;
    const uint64_t begin = t->seen, end = t->seen + n;
    t->seen = end;
    if (end <= skip) return n;
    const uint64_t from = std::max(begin, skip);
    bytes += from - begin;
    length = end - from;
    if (r->received + length > q->out_size) {
      if (q->range && status == 200)
        length = q->out_size - r->received;  // the rest is not ours
      else {
        r->overflow = true;
        return 0;
      }
    }
    std::memcpy(q->out + r->received, bytes, length);
    r->received += length;
    return n;
  }
  if (r->received + length > q->max_size) {
    r->overflow = true;
    return 0;
  }
  q->out_vec->insert(q->out_vec->end(), bytes, bytes + length);
  r->received += length;
  return n;
}

size_t OnRead(char* buffer, size_t size, size_t count, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  const Request* q = t->request;
  const uint64_t n = std::min<uint64_t>(size * count, q->body_size - t->sent);
  if (n == 0) return 0;
  if (q->body_fd >= 0) {
    const ssize_t got = pread(q->body_fd, buffer, n, static_cast<off_t>(q->body_offset + t->sent));
    if (got <= 0) return CURL_READFUNC_ABORT;
    t->sent += static_cast<uint64_t>(got);
    return static_cast<size_t>(got);
  }
  std::memcpy(buffer, q->body + t->sent, n);
  t->sent += n;
  return n;
}

int OnSeek(void* user, curl_off_t offset, int origin) {
  Transfer* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->request->body_size) {
    return CURL_SEEKFUNC_FAIL;
  }
  t->sent = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

bool Retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: return true;
    default: return false;
  }
}

std::string S3Error(const std::string& body) { return S3ErrorText(body.data(), body.size()); }

// HTTP over a pool of libcurl handles (kept for their open connections), with retries.
class HttpClient {
 public:
  struct Signing {
    std::string region, key_id, secret, token;  // empty key_id: anonymous requests
  };

  HttpClient(const StoreOptions& options, Signing signing)
      : options_(options), signing_(std::move(signing)) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }
  ~HttpClient() {
    for (CURL* c : idle_) curl_easy_cleanup(c);
  }

  // Performs `request` until it gets an answer that is not worth retrying, or `attempts`
  // tries have failed (kUnavailable, naming `what`). A non-2xx answer is left in
  // `response` for the caller to map (see Fail).
  Status Perform(const Request& request, Response* response, const std::string& what) {
    std::string last;
    for (int attempt = 1;; ++attempt) {
      *response = Response();
      if (request.out_vec != nullptr) request.out_vec->clear();
      CURLcode code = CURLE_OK;
      {
        CURL* curl = Acquire();
        code = Once(curl, request, response);
        Release(curl);
      }
      if (code == CURLE_OK) {
        // 409 ConditionalRequestConflict: S3 asks to retry a conditional write that met a
        // concurrent one (the retry then finds the winner's object: 412).
        const long s = response->status;
        if (!(s >= 500 || s == 429 || s == 409)) return Status::Ok();
        const std::string detail = S3Error(response->error_body);
        last = "HTTP " + std::to_string(s) + (detail.empty() ? "" : " (" + detail + ")");
      } else if (code == CURLE_WRITE_ERROR && response->wrong_range) {
        last = "a 206 answer with another Content-Range than the range asked for";
      } else if (code == CURLE_WRITE_ERROR && response->overflow) {
        return Status(
            ErrorCode::kCorruptHeader,
            what + ": the answer is longer than expected (" +
                std::to_string(request.out != nullptr ? request.out_size : request.max_size) +
                " bytes)");
      } else if (!Retryable(code)) {
        return Status(ErrorCode::kUnavailable, what + ": " + curl_easy_strerror(code));
      } else {
        last = curl_easy_strerror(code);
      }
      if (attempt >= std::max(1, options_.attempts)) {
        return Status(ErrorCode::kUnavailable, what + ": " + request.method + " failed " +
                                                   std::to_string(attempt) +
                                                   " times, last: " + last);
      }
      Backoff(attempt);
    }
  }

 private:
  CURLcode Once(CURL* curl, const Request& q, Response* r) {
    curl_easy_reset(curl);
    Transfer t{curl, &q, r};
    curl_easy_setopt(curl, CURLOPT_URL, q.url.c_str());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, static_cast<long>(options_.connect_timeout_s));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.stall_timeout_s));
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
    struct curl_slist* headers = nullptr;
    for (const std::string& h : q.headers) headers = curl_slist_append(headers, h.c_str());
    if (!signing_.key_id.empty()) {
      headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (!signing_.token.empty()) {
        headers = curl_slist_append(headers, ("x-amz-security-token: " + signing_.token).c_str());
      }
      const std::string sigv4 = "aws:amz:" + signing_.region + ":s3";
      curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(curl, CURLOPT_USERNAME, signing_.key_id.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, signing_.secret.c_str());
    }
    const std::string method = q.method;
    if (method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (method == "PUT") {
      curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(q.body_size));
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
      curl_easy_setopt(curl, CURLOPT_READDATA, &t);
      curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, OnSeek);
      curl_easy_setopt(curl, CURLOPT_SEEKDATA, &t);
    } else if (method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body_size));
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                       q.body != nullptr ? reinterpret_cast<const char*>(q.body) : "");
    } else if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, q.method);
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    const CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(headers);
    return code;
  }

  void Backoff(int attempt) {
    double wait = options_.backoff_s;
    for (int i = 1; i < attempt; ++i) wait *= 2;
    wait = std::min(wait, options_.max_backoff_s);
    static thread_local std::mt19937 rng(std::random_device{}());
    wait *= std::uniform_real_distribution<double>(0.5, 1.0)(rng);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }

  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        CURL* c = idle_.back();
        idle_.pop_back();
        return c;
      }
    }
    return curl_easy_init();
  }
  void Release(CURL* curl) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(curl);
  }

  const StoreOptions options_;
  const Signing signing_;
  std::mutex mutex_;
  std::vector<CURL*> idle_;
};

// The error for a non-2xx answer to a request about `what`. Anonymous readers of a bucket
// (a CDN, a public bucket) get 403 for a missing key too, as S3 answers those who may not
// list the bucket: with `forbidden_is_missing`, 403 counts as not found.
Status Fail(const Response& r, const std::string& what, const std::string& method,
            bool forbidden_is_missing = false) {
  const std::string detail = S3Error(r.error_body);
  const std::string suffix = detail.empty() ? "" : " (" + detail + ")";
  if (forbidden_is_missing && r.status == 403) {
    return Status(ErrorCode::kNotFound, what + ": not found or not readable (HTTP 403)" + suffix);
  }
  switch (r.status) {
    case 404: return Status(ErrorCode::kNotFound, what + ": not found" + suffix);
    case 401:
    case 403:
      return Status(ErrorCode::kPermissionDenied,
                    what + ": access denied (HTTP " + std::to_string(r.status) + ")" + suffix +
                        "; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the bucket's policy");
    case 412: return Status(ErrorCode::kAlreadyExists, what + ": already exists" + suffix);
    case 416:
      return Status(ErrorCode::kTruncated,
                    what + ": the object is shorter than the range asked for");
    default:
      return Status(ErrorCode::kInvalidArgument,
                    what + ": " + method + " answered HTTP " + std::to_string(r.status) + suffix);
  }
}

bool Success(long status) { return status >= 200 && status < 300; }

// What both backends share: GETs, ranges, HEADs and conditional GETs of `Url(key)`.
class CurlStore : public Store {
 public:
  // Whether a 403 answer means "not found" (see Fail).
  virtual bool ForbiddenIsMissing() const { return false; }
  CurlStore(std::string url, const StoreOptions& options, HttpClient::Signing signing)
      : url_(std::move(url)), options_(options), client_(options, std::move(signing)) {}
  const std::string& url() const override { return url_; }

  Status Head(const std::string& key, ObjectInfo* info) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    Request q;
    q.method = "HEAD";
    q.url = Url(key);
    Response r;
    std::vector<uint8_t> none;
    q.out_vec = &none;
    q.max_size = 0;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    if (!Success(r.status)) return Fail(r, Name(key), "HEAD", ForbiddenIsMissing());
    if (r.headers.content_length == UINT64_MAX) {
      return Status(ErrorCode::kUnavailable,
                    Name(key) + ": HEAD answered without a well-formed Content-Length");
    }
    *info = {key, r.headers.content_length, r.headers.etag};
    return Status::Ok();
  }

  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    Request q;
    q.url = Url(key);
    if (!etag.empty()) q.headers.push_back("If-None-Match: " + etag);
    std::vector<uint8_t> body;
    q.out_vec = &body;
    q.max_size = max_size;
    Response r;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    *changed = r.status != 304;
    if (!*changed) return Status::Ok();
    if (!Success(r.status)) return Fail(r, Name(key), "GET", ForbiddenIsMissing());
    *data = std::move(body);
    if (info != nullptr) *info = {key, data->size(), r.headers.etag};
    return Status::Ok();
  }

  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    if (size == 0) return Status::Ok();
    Request q;
    q.url = Url(key);
    q.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" +
                        std::to_string(offset + size - 1));
    q.out = out;
    q.out_size = size;
    q.range = true;
    q.range_offset = offset;
    Response r;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    if (!Success(r.status)) return Fail(r, Name(key), "GET", ForbiddenIsMissing());
    if (r.received != size) {
      return Status(ErrorCode::kTruncated,
                    Name(key) + ": ends before byte " + std::to_string(offset + size));
    }
    return Status::Ok();
  }

 protected:
  virtual std::string Url(const std::string& key) const = 0;
  std::string Name(const std::string& key) const { return url_ + "/" + key; }
  Status Check(const std::string& key) const {
    if (!ValidKey(key))
      return Status(ErrorCode::kInvalidArgument, "malformed store key '" + key + "'");
    return Status::Ok();
  }

  const std::string url_;
  const StoreOptions options_;
  HttpClient client_;
};

class S3Store : public CurlStore {
 public:
  S3Store(std::string endpoint, std::string bucket, std::string prefix, std::string url,
          const StoreOptions& options, HttpClient::Signing signing)
      : CurlStore(std::move(url), options, std::move(signing)),
        endpoint_(std::move(endpoint)),
        bucket_(std::move(bucket)),
        prefix_(std::move(prefix)) {}
  bool writable() const override { return true; }
  bool listable() const override { return true; }

  Status Put(const std::string& key, const uint8_t* data, uint64_t size, PutMode mode) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    Request q;
    q.method = "PUT";
    q.url = Url(key);
    q.body = data;
    q.body_size = size;
    return Upload(q, key, mode);
  }

  Status PutFile(const std::string& key, const std::string& path, PutMode mode) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return file_io::Error(path, "cannot open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const Status s = file_io::Error(path, "cannot stat");
      close(fd);
      return s;
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    Status s;
    if (size <= options_.part_bytes) {
      Request q;
      q.method = "PUT";
      q.url = Url(key);
      q.body_fd = fd;
      q.body_size = size;
      s = Upload(q, key, mode);
    } else {
      s = PutMultipart(key, fd, size, mode);
    }
    close(fd);
    return s;
  }

  Status List(const std::string& prefix, std::vector<ObjectInfo>* objects) override {
    objects->clear();
    const std::string full = prefix_.empty() ? prefix : prefix_ + "/" + prefix;
    std::string token;
    for (;;) {
      std::map<std::string, std::string> params = {{"list-type", "2"}, {"prefix", full}};
      if (!token.empty()) params["continuation-token"] = token;
      Request q;
      q.url = endpoint_ + "/" + PercentEncode(bucket_, false) + CanonicalQuery(params);
      std::vector<uint8_t> body;
      q.out_vec = &body;
      q.max_size = 64u << 20;
      Response r;
      ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, url_));
      if (!Success(r.status)) return Fail(r, url_ + " (listing '" + prefix + "')", "GET");
      ListingPage page;
      ARC_V3_RETURN_IF_ERROR(ParseListing(reinterpret_cast<const char*>(body.data()), body.size(),
                                          prefix_, url_, &page));
      objects->insert(objects->end(), page.objects.begin(), page.objects.end());
      if (!page.truncated) break;
      token = page.next_token;
    }
    std::sort(objects->begin(), objects->end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return Status::Ok();
  }

  Status Delete(const std::string& key) override {
    ARC_V3_RETURN_IF_ERROR(Check(key));
    Request q;
    q.method = "DELETE";
    q.url = Url(key);
    std::vector<uint8_t> none;
    q.out_vec = &none;
    q.max_size = 1u << 20;
    Response r;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    if (!Success(r.status) && r.status != 404) return Fail(r, Name(key), "DELETE");
    return Status::Ok();
  }

 protected:
  std::string Url(const std::string& key) const override {
    return endpoint_ + "/" + PercentEncode(bucket_, false) + "/" +
           PercentEncode(prefix_.empty() ? key : prefix_ + "/" + key, true);
  }

 private:
  // What HTTP caches may do with the object (PutMode): stored with it, sent with every GET.
  static std::string CacheControl(PutMode mode) {
    return mode == PutMode::kCreateOnly ? "Cache-Control: public, max-age=31536000, immutable"
                                        : "Cache-Control: no-cache";
  }

  // A single PUT; write-once through If-None-Match (412 when the key exists).
  Status Upload(Request& q, const std::string& key, PutMode mode) {
    if (mode == PutMode::kCreateOnly) q.headers.push_back("If-None-Match: *");
    q.headers.push_back(CacheControl(mode));
    std::vector<uint8_t> answer;
    q.out_vec = &answer;
    q.max_size = 1u << 20;
    Response r;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    if (!Success(r.status)) return Fail(r, Name(key), "PUT");
    return Status::Ok();
  }

  // One POST / DELETE of the multipart protocol; the answer's body into *answer_out.
  Status Call(const char* method, const std::string& url, const std::string& body,
              const std::string& key, std::string* answer_out,
              std::vector<std::string> headers = {}) {
    Request q;
    q.method = method;
    q.url = url;
    q.headers = std::move(headers);
    q.body = reinterpret_cast<const uint8_t*>(body.data());
    q.body_size = body.size();
    std::vector<uint8_t> answer;
    q.out_vec = &answer;
    q.max_size = 16u << 20;
    Response r;
    ARC_V3_RETURN_IF_ERROR(client_.Perform(q, &r, Name(key)));
    if (!Success(r.status)) return Fail(r, Name(key), method);
    // CompleteMultipartUpload may fail after a 200, with an Error document.
    const std::string detail = S3Error(std::string(answer.begin(), answer.end()));
    if (!detail.empty())
      return Status(ErrorCode::kUnavailable, Name(key) + ": " + method + ": " + detail);
    if (answer_out != nullptr) answer_out->assign(answer.begin(), answer.end());
    return Status::Ok();
  }

  Status PutMultipart(const std::string& key, int fd, uint64_t size, PutMode mode) {
    if (mode == PutMode::kCreateOnly) {
      ObjectInfo info;
      Status s = Head(key, &info);
      if (s.ok()) return Status(ErrorCode::kAlreadyExists, Name(key) + ": already exists");
      if (s.code() != ErrorCode::kNotFound) return s;
    }
    std::string initiated;
    ARC_V3_RETURN_IF_ERROR(Call("POST", Url(key) + CanonicalQuery({{"uploads", ""}}), "", key,
                                &initiated, {CacheControl(mode)}));
    std::string upload_id;
    Status s = ParseUploadId(initiated.data(), initiated.size(), Name(key), &upload_id);
    if (!s.ok()) return s;
    const uint64_t part = options_.part_bytes;
    const size_t parts = static_cast<size_t>((size + part - 1) / part);
    std::vector<std::string> etags(parts);
    std::mutex mutex;
    ParallelFor(
        parts, WorkerCount(std::max(1, options_.connections), parts), [&](size_t i, size_t) {
          {
            std::lock_guard<std::mutex> lock(mutex);
            if (!s.ok()) return;
          }
          Request q;
          q.method = "PUT";
          q.url = Url(key) +
                  CanonicalQuery({{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}});
          q.body_fd = fd;
          q.body_offset = i * part;
          q.body_size = std::min(part, size - i * part);
          std::vector<uint8_t> answer;
          q.out_vec = &answer;
          q.max_size = 1u << 20;
          Response r;
          Status st = client_.Perform(q, &r, Name(key));
          if (st.ok() && !Success(r.status)) st = Fail(r, Name(key), "PUT part");
          if (st.ok() && r.headers.etag.empty())
            st = Status(ErrorCode::kUnavailable, Name(key) + ": a part without an ETag");
          std::lock_guard<std::mutex> lock(mutex);
          if (!st.ok() && s.ok()) s = st;
          etags[i] = r.headers.etag;
        });
    if (s.ok()) {
      std::string body = "<CompleteMultipartUpload>";
      for (size_t i = 0; i < parts; ++i) {
        body += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
                XmlText(etags[i]) + "</ETag></Part>";
      }
      body += "</CompleteMultipartUpload>";
      s = Call("POST", Url(key) + CanonicalQuery({{"uploadId", upload_id}}), body, key, nullptr);
    }
    // Best effort: the upload's own error is the one returned.
    if (!s.ok())
      (void)Call("DELETE", Url(key) + CanonicalQuery({{"uploadId", upload_id}}), "", key, nullptr);
    return s;
  }

  const std::string endpoint_, bucket_, prefix_;
};

class HttpStore : public CurlStore {
 public:
  HttpStore(std::string base, const StoreOptions& options)
      : CurlStore(base, options, HttpClient::Signing()), base_(std::move(base)) {
    while (!base_.empty() && base_.back() == '/') base_.pop_back();
  }
  bool writable() const override { return false; }
  bool listable() const override { return false; }
  bool ForbiddenIsMissing() const override { return true; }
  Status Put(const std::string&, const uint8_t*, uint64_t, PutMode) override { return ReadOnly(); }
  Status PutFile(const std::string&, const std::string&, PutMode) override { return ReadOnly(); }
  Status Delete(const std::string&) override { return ReadOnly(); }
  Status List(const std::string&, std::vector<ObjectInfo>*) override {
    return Status(ErrorCode::kInvalidArgument,
                  url_ + ": an http(s):// store cannot list objects; use the bucket's s3:// URL");
  }

 protected:
  std::string Url(const std::string& key) const override {
    return base_ + "/" + PercentEncode(key, true);
  }

 private:
  Status ReadOnly() const {
    return Status(ErrorCode::kInvalidArgument, url_ + ": an http(s):// store is read-only");
  }
  std::string base_;
};

}  // namespace

Status NewS3Store(const std::string& bucket, const std::string& prefix, const std::string& url,
                  const StoreOptions& options, std::unique_ptr<Store>* store) {
  HttpClient::Signing signing;
  signing.region = Env("AWS_REGION");
  if (signing.region.empty()) signing.region = Env("AWS_DEFAULT_REGION");
  if (signing.region.empty()) signing.region = "us-east-1";
  signing.key_id = Env("AWS_ACCESS_KEY_ID");
  signing.secret = Env("AWS_SECRET_ACCESS_KEY");
  signing.token = Env("AWS_SESSION_TOKEN");
  if (signing.key_id.empty() != signing.secret.empty()) {
    return Status(ErrorCode::kInvalidArgument,
                  "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither (anonymous)");
  }
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = "https://s3." + signing.region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (endpoint.compare(0, 7, "http://") != 0 && endpoint.compare(0, 8, "https://") != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "AWS_ENDPOINT_URL '" + endpoint + "' is not an http(s) URL");
  }
  *store = std::make_unique<S3Store>(endpoint, bucket, prefix, url, options, std::move(signing));
  return Status::Ok();
}

Status NewHttpStore(const std::string& base_url, const StoreOptions& options,
                    std::unique_ptr<Store>* store) {
  *store = std::make_unique<HttpStore>(base_url, options);
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3

// Object stores for the sync layer: one interface, three backends chosen by URL.
//
//   /path, file:///path        a local directory (one machine or a shared file system)
//   s3://BUCKET[/PREFIX]       an S3-compatible object store (libcurl, SigV4, path-style)
//   http(s)://HOST[/PREFIX]    read-only: a web server or CDN in front of a bucket
//
// Keys are relative to the URL's prefix: '/'-separated components of [A-Za-z0-9._-],
// none of them "." or "..". Every call is safe from several threads at once.
#ifndef ARC_V3_SRC_SYNC_STORE_H_
#define ARC_V3_SRC_SYNC_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace sync {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // opaque version tag; changes whenever the object does
};

// How a write treats an existing key, and what HTTP caches in front of the store may do
// with the object (an S3 store sends the Cache-Control header; see PROTOCOL.md, "Roles
// and stores").
enum class PutMode {
  // Replaces the object atomically: readers see the old or the new bytes. For mutable keys
  // (`latest`): Cache-Control: no-cache, so a cache asks the store on every read.
  kOverwrite,
  // Write-once: kAlreadyExists if the key exists (atomic against racing writers). For keys
  // whose bytes never change: Cache-Control: public, max-age=31536000, immutable.
  kCreateOnly,
};

// How a store retries and how wide it transfers. The defaults suit a trainer and a region.
struct StoreOptions {
  // Tries of one request that timed out, lost its connection or got a 5xx / 429 answer;
  // waits backoff_s, then twice as long each time (with jitter), at most max_backoff_s.
  int attempts = 5;
  double backoff_s = 0.25;
  double max_backoff_s = 4;
  int connect_timeout_s = 10;
  // A transfer that moves no byte for this long fails (and is retried).
  int stall_timeout_s = 30;
  // Parallel transfers of one big object (multipart upload parts, download ranges).
  int connections = 8;
  // Objects above this size are uploaded in parts and downloaded in ranges of this size.
  uint64_t part_bytes = uint64_t{16} << 20;
  // A local store's directory is created if it is missing (a writer's first publish);
  // otherwise a missing directory is kNotFound.
  bool create = false;
};

class Store {
 public:
  virtual ~Store() = default;
  // The URL the store was opened from, for messages.
  virtual const std::string& url() const = 0;
  // False for http(s):// stores: Put and Delete fail with kInvalidArgument.
  virtual bool writable() const = 0;
  // Whether List works (http(s):// stores cannot list).
  virtual bool listable() const = 0;

  // Errors of every call: kNotFound (no such key), kPermissionDenied (credentials or
  // access), kUnavailable (unreachable, or failing after `attempts` tries), each naming
  // the key; kInvalidArgument for a malformed key.
  virtual Status Head(const std::string& key, ObjectInfo* info) = 0;
  // The whole object; `info` may be null. An object over `max_size` bytes fails with
  // kCorruptHeader before more than max_size bytes are held.
  Status Get(const std::string& key, uint64_t max_size, std::vector<uint8_t>* data,
             ObjectInfo* info) {
    bool changed = true;
    return GetIfChanged(key, "", max_size, data, info, &changed);
  }
  // Get unless the object's etag still is `etag`: then *changed is false and `data` and
  // `info` are left alone. A conditional request where the store has one.
  virtual Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                              std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) = 0;
  // Bytes [offset, offset + size) into `out`; kTruncated if the object is shorter.
  virtual Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) = 0;
  virtual Status Put(const std::string& key, const uint8_t* data, uint64_t size, PutMode mode) = 0;
  // Uploads a file (in parallel parts where it is big). kCreateOnly on a multipart upload
  // checks for the key first: use it for keys named by their contents.
  virtual Status PutFile(const std::string& key, const std::string& path, PutMode mode) = 0;
  // Every object whose key starts with `prefix`, sorted by key.
  virtual Status List(const std::string& prefix, std::vector<ObjectInfo>* objects) = 0;
  // Deleting an absent key succeeds.
  virtual Status Delete(const std::string& key) = 0;

  // Downloads an object into a new file at `path` (in parallel ranges where it is big);
  // `expected_size` (UINT64_MAX: unknown) saves a HEAD. The file is removed on error.
  Status GetToFile(const std::string& key, const std::string& path, uint64_t expected_size,
                   const StoreOptions& options);
};

// Opens the store a URL names (see the top of this file). Environment for s3://:
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (default https://s3.REGION.amazonaws.com),
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (none: anonymous requests),
// AWS_REGION or AWS_DEFAULT_REGION (default us-east-1). A local store's directory
// must exist unless options.create. Errors: kInvalidArgument (malformed URL, a path that
// is not a directory or cannot be created), kNotFound (no such directory).
Status OpenStore(const std::string& url, const StoreOptions& options,
                 std::unique_ptr<Store>* store);

// Stores the library does not build in (another backend, a test's fault-injecting store):
// once registered, OpenStore hands every URL starting with `scheme` + "://" to `opener`,
// and so does everything that opens a store by URL (Follower::Open, the CLI). Registering
// a scheme again replaces its opener. kInvalidArgument for a built-in scheme (s3, http,
// https, file) or a name that is not [a-z][a-z0-9+.-]*. Thread-safe.
using StoreOpener = std::function<Status(const std::string& url, const StoreOptions& options,
                                         std::unique_ptr<Store>* store)>;
Status RegisterStoreScheme(const std::string& scheme, StoreOpener opener);

// Whether `key` is a well-formed key (see the top of this file).
bool ValidKey(const std::string& key);

// Backends, for OpenStore and the tests.
std::unique_ptr<Store> NewLocalStore(const std::string& root, const std::string& url);
Status NewS3Store(const std::string& bucket, const std::string& prefix, const std::string& url,
                  const StoreOptions& options, std::unique_ptr<Store>* store);
Status NewHttpStore(const std::string& base_url, const StoreOptions& options,
                    std::unique_ptr<Store>* store);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_STORE_H_

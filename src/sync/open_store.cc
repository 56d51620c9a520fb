// Opening a store by its URL (store.h, OpenStore): the schemes registered at run time,
// then s3://, http(s):// (http_store.cc) and a local directory (store.cc). The one place
// that needs every backend, so the protocol builds against the store interface alone.
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

namespace fs = std::filesystem;

namespace {

std::mutex& SchemesMutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, StoreOpener>& Schemes() {
  static std::map<std::string, StoreOpener> schemes;
  return schemes;
}

}  // namespace

Status RegisterStoreScheme(const std::string& scheme, StoreOpener opener) {
  bool valid = !scheme.empty() && scheme[0] >= 'a' && scheme[0] <= 'z';
  for (char c : scheme) {
    valid = valid &&
            ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '.' || c == '-');
  }
  if (!valid || scheme == "s3" || scheme == "http" || scheme == "https" || scheme == "file") {
    return Status(ErrorCode::kInvalidArgument, "cannot register store scheme '" + scheme + "'");
  }
  std::lock_guard<std::mutex> lock(SchemesMutex());
  Schemes()[scheme] = std::move(opener);
  return Status::Ok();
}

Status OpenStore(const std::string& url, const StoreOptions& options,
                 std::unique_ptr<Store>* store) {
  const auto has_prefix = [&](const char* p) { return url.compare(0, std::strlen(p), p) == 0; };
  const size_t scheme_end = url.find("://");
  if (scheme_end != std::string::npos) {
    StoreOpener opener;
    {
      std::lock_guard<std::mutex> lock(SchemesMutex());
      const auto it = Schemes().find(url.substr(0, scheme_end));
      if (it != Schemes().end()) opener = it->second;
    }
    if (opener) return opener(url, options, store);
  }
  if (has_prefix("s3://")) {
    const std::string rest = url.substr(5);
    const size_t slash = rest.find('/');
    const std::string bucket = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (bucket.empty() || (!prefix.empty() && !ValidKey(prefix))) {
      return Status(ErrorCode::kInvalidArgument, "malformed store URL '" + url +
                                                     "': expected s3://BUCKET[/PREFIX], the prefix "
                                                     "made of [A-Za-z0-9._-] and '/'");
    }
    return NewS3Store(bucket, prefix, url, options, store);
  }
  if (has_prefix("http://") || has_prefix("https://")) return NewHttpStore(url, options, store);
  std::string path = url;
  if (has_prefix("file://")) path = url.substr(7);
  if (path.empty() || (url.find("://") != std::string::npos && !has_prefix("file://"))) {
    return Status(ErrorCode::kInvalidArgument,
                  "unknown store URL '" + url +
                      "': use a local store (a directory's path or file://), s3:// or http(s)://");
  }
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) {
      return Status(ErrorCode::kInvalidArgument, "store '" + path + "' is not a directory");
    }
    if (!options.create) {
      return Status(ErrorCode::kNotFound, "local store '" + path +
                                              "' does not exist: nothing was published there "
                                              "(publishing creates it)");
    }
    fs::create_directories(path, ec);
    std::error_code ec2;
    if (!fs::is_directory(path, ec2)) {
      return Status(ErrorCode::kInvalidArgument,
                    "local store '" + path + "' cannot be created: " + ec.message());
    }
  }
  std::string root = fs::absolute(path, ec).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  *store = NewLocalStore(root, url);
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3

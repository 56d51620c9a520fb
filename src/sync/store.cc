// Key rules, downloads into files, and the local directory store (store.h; opening a store
// by URL is open_store.cc's).
#include "src/sync/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "src/common/file_io.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {
namespace {

namespace fs = std::filesystem;

Status Errno(ErrorCode code, const std::string& what) {
  return Status(code, what + ": " + std::strerror(errno));
}

// A local file that could not be created or put in place: access refused (or a read-only
// file system) is kPermissionDenied, anything else (a full disk) kIoError.
Status CreateError(const std::string& what) {
  const bool refused = errno == EACCES || errno == EPERM || errno == EROFS;
  return Errno(refused ? ErrorCode::kPermissionDenied : ErrorCode::kIoError, what);
}

Status ReadAll(int fd, uint8_t* out, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n =
        pread(fd, out, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(ErrorCode::kUnavailable, path + ": cannot read");
    if (n == 0) return Status(ErrorCode::kTruncated, path + ": shorter than expected");
    out += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// A file's etag: it changes whenever a write or a rename replaces the file.
std::string StatTag(const struct stat& st) {
  return std::to_string(st.st_ino) + "-" + std::to_string(st.st_size) + "-" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

// Keys are files below the root; a write goes to a hidden temporary file in the key's
// directory, is synced, and is then renamed (overwrite) or hard-linked (create-only:
// link fails if the name exists, atomically, also on NFS) into place.
class LocalStore : public Store {
 public:
  LocalStore(std::string root, std::string url) : root_(std::move(root)), url_(std::move(url)) {}
  const std::string& url() const override { return url_; }
  bool writable() const override { return true; }
  bool listable() const override { return true; }

  Status Head(const std::string& key, ObjectInfo* info) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    struct stat st;
    if (stat(Path(key).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return Missing(key, errno);
    *info = {key, static_cast<uint64_t>(st.st_size), StatTag(st)};
    return Status::Ok();
  }

  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    const std::string path = Path(key);
    struct stat st;
    int fd = -1;
    ARC_V3_RETURN_IF_ERROR(OpenObject(key, &fd, &st));
    const std::string tag = StatTag(st);
    *changed = etag.empty() || tag != etag;
    Status s;
    if (*changed && static_cast<uint64_t>(st.st_size) > max_size) {
      s = Status(ErrorCode::kCorruptHeader, Name(key) + ": " + std::to_string(st.st_size) +
                                                " bytes, more than the " +
                                                std::to_string(max_size) + " it may have");
    } else if (*changed) {
      std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
      s = ReadAll(fd, bytes.data(), bytes.size(), 0, path);
      if (s.ok()) {
        *data = std::move(bytes);
        if (info != nullptr) *info = {key, static_cast<uint64_t>(st.st_size), tag};
      }
    }
    close(fd);
    return s;
  }

  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    const std::string path = Path(key);
    struct stat st;
    int fd = -1;
    ARC_V3_RETURN_IF_ERROR(OpenObject(key, &fd, &st));
    Status s = ReadAll(fd, out, size, offset, path);
    close(fd);
    if (s.code() == ErrorCode::kTruncated) {
      return Status(ErrorCode::kTruncated,
                    Name(key) + ": ends before byte " + std::to_string(offset + size));
    }
    return s;
  }

  Status Put(const std::string& key, const uint8_t* data, uint64_t size, PutMode mode) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    std::string temp;
    ARC_V3_RETURN_IF_ERROR(
        WriteTemp(key, &temp, [&](int fd) { return file_io::WriteAt(fd, data, size, 0, temp); }));
    return Publish(key, temp, mode);
  }

  Status PutFile(const std::string& key, const std::string& path, PutMode mode) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return Errno(ErrorCode::kIoError, path + ": cannot open");
    std::string temp;
    Status s = WriteTemp(key, &temp, [&](int fd) {
      std::vector<uint8_t> buffer(size_t{1} << 20);
      uint64_t at = 0;
      for (;;) {
        const ssize_t n = read(in, buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Errno(ErrorCode::kIoError, path + ": cannot read");
        if (n == 0) return Status::Ok();
        ARC_V3_RETURN_IF_ERROR(
            file_io::WriteAt(fd, buffer.data(), static_cast<uint64_t>(n), at, temp));
        at += static_cast<uint64_t>(n);
      }
    });
    close(in);
    if (!s.ok()) return s;
    return Publish(key, temp, mode);
  }

  Status List(const std::string& prefix, std::vector<ObjectInfo>* objects) override {
    objects->clear();
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) {
      return Status(ErrorCode::kUnavailable, url_ + ": the store's directory is gone");
    }
    // Only the folder the prefix names is walked ("steps/000000000042/": that step's).
    const size_t slash = prefix.rfind('/');
    if (slash != std::string::npos && !ValidKey(prefix.substr(0, slash))) {
      return Status(ErrorCode::kInvalidArgument, "malformed listing prefix '" + prefix + "'");
    }
    const std::string start =
        slash == std::string::npos ? root_ : root_ + "/" + prefix.substr(0, slash);
    if (!fs::is_directory(start, ec)) return Status::Ok();  // nothing under that prefix
    for (auto it = fs::recursive_directory_iterator(start, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const std::string key = fs::relative(it->path(), root_, ec).generic_string();
      // Writes in flight are hidden files (".NAME.tmp-..."), not objects.
      if (!ValidKey(key) || it->path().filename().string()[0] == '.' ||
          key.compare(0, prefix.size(), prefix) != 0) {
        continue;
      }
      struct stat st;
      if (stat(it->path().c_str(), &st) != 0) continue;  // deleted meanwhile
      objects->push_back({key, static_cast<uint64_t>(st.st_size), StatTag(st)});
    }
    if (ec) return Status(ErrorCode::kUnavailable, url_ + ": cannot list: " + ec.message());
    std::sort(objects->begin(), objects->end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return Status::Ok();
  }

  Status Delete(const std::string& key) override {
    ARC_V3_RETURN_IF_ERROR(CheckKey(key));
    if (unlink(Path(key).c_str()) != 0 && errno != ENOENT) {
      return Errno(ErrorCode::kPermissionDenied, Name(key) + ": cannot delete");
    }
    return Status::Ok();
  }

 private:
  std::string Path(const std::string& key) const { return root_ + "/" + key; }
  std::string Name(const std::string& key) const { return url_ + "/" + key; }

  Status CheckKey(const std::string& key) const {
    if (!ValidKey(key))
      return Status(ErrorCode::kInvalidArgument, "malformed store key '" + key + "'");
    return Status::Ok();
  }

  // Opens the object at `key` for reading: a regular file only. The open never waits (a
  // FIFO put there by whoever writes the store would block it for ever), and a directory
  // is no object (kNotFound); a FIFO, socket or device is kCorruptHeader.
  Status OpenObject(const std::string& key, int* fd, struct stat* st) const {
    *fd = open(Path(key).c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (*fd < 0) return Missing(key, errno);
    Status s;
    if (fstat(*fd, st) != 0) {
      s = Errno(ErrorCode::kUnavailable, Name(key) + ": cannot stat");
    } else if (S_ISDIR(st->st_mode)) {
      s = Status(ErrorCode::kNotFound, Name(key) + ": not a file");
    } else if (!S_ISREG(st->st_mode)) {
      s = Status(ErrorCode::kCorruptHeader,
                 Name(key) + " is not a regular file (a FIFO, socket or device is no object)");
    }
    if (!s.ok()) {
      close(*fd);
      *fd = -1;
    }
    return s;
  }

  Status Missing(const std::string& key, int error) const {
    if (error == EACCES || error == EPERM) {
      return Status(ErrorCode::kPermissionDenied, Name(key) + ": " + std::strerror(error));
    }
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) {
      return Status(ErrorCode::kUnavailable, url_ + ": the store's directory is gone");
    }
    return Status(ErrorCode::kNotFound, Name(key) + ": not found");
  }

  // Creates the key's directories and a synced temporary file beside the key, filled by `fill`.
  template <class Fill>
  Status WriteTemp(const std::string& key, std::string* temp, const Fill& fill) {
    const fs::path path(Path(key));
    std::error_code ec;
    // Never re-create a store whose directory went away (an unmounted share, say).
    if (!fs::is_directory(root_, ec))
      return Status(ErrorCode::kUnavailable, url_ + ": the store's directory is gone");
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      return Status(
          fs::is_directory(root_) ? ErrorCode::kPermissionDenied : ErrorCode::kUnavailable,
          Name(key) + ": cannot create its directory: " + ec.message());
    }
    static std::atomic<uint64_t> counter{0};
    *temp = (path.parent_path() / ("." + path.filename().string() + ".tmp-" +
                                   std::to_string(getpid()) + "-" + std::to_string(counter++)))
                .string();
    const int fd = open(temp->c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return CreateError(*temp + ": cannot create");
    Status s = fill(fd);
    if (s.ok() && fsync(fd) != 0) s = Errno(ErrorCode::kIoError, *temp + ": cannot sync");
    if (close(fd) != 0 && s.ok()) s = Errno(ErrorCode::kIoError, *temp + ": cannot close");
    if (!s.ok()) unlink(temp->c_str());
    return s;
  }

  Status Publish(const std::string& key, const std::string& temp, PutMode mode) {
    const std::string path = Path(key);
    Status s;
    if (mode == PutMode::kCreateOnly) {
      if (link(temp.c_str(), path.c_str()) != 0) {
        s = errno == EEXIST ? Status(ErrorCode::kAlreadyExists, Name(key) + ": already exists")
                            : CreateError(Name(key) + ": cannot create");
      }
      unlink(temp.c_str());
    } else if (rename(temp.c_str(), path.c_str()) != 0) {
      s = CreateError(Name(key) + ": cannot replace");
      unlink(temp.c_str());
    }
    if (!s.ok()) return s;
    return file_io::SyncDirectory(fs::path(path).parent_path().string());
  }

  std::string root_, url_;
};

}  // namespace

bool ValidKey(const std::string& key) {
  if (key.empty() || key.size() > 1024) return false;
  size_t begin = 0;
  while (begin <= key.size()) {
    size_t end = key.find('/', begin);
    if (end == std::string::npos) end = key.size();
    const std::string part = key.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
      if (!ok) return false;
    }
    begin = end + 1;
  }
  return true;
}

std::unique_ptr<Store> NewLocalStore(const std::string& root, const std::string& url) {
  return std::make_unique<LocalStore>(root, url);
}

Status Store::GetToFile(const std::string& key, const std::string& path, uint64_t expected_size,
                        const StoreOptions& options) {
  uint64_t size = expected_size;
  if (size == UINT64_MAX) {
    ObjectInfo info;
    ARC_V3_RETURN_IF_ERROR(Head(key, &info));
    size = info.size;
  }
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return file_io::Error(path, "cannot create");
  Status s = file_io::Reserve(fd, size, path);
  const uint64_t part = std::max<uint64_t>(options.part_bytes, 1);
  const size_t parts = static_cast<size_t>((size + part - 1) / part);
  std::mutex mutex;
  if (s.ok()) {
    ParallelFor(parts, WorkerCount(std::max(1, options.connections), parts), [&](size_t i, size_t) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!s.ok()) return;
      }
      const uint64_t offset = i * part, bytes = std::min(part, size - offset);
      std::vector<uint8_t> buffer(bytes);
      Status st = GetRange(key, offset, bytes, buffer.data());
      if (st.ok()) st = file_io::WriteAt(fd, buffer.data(), bytes, offset, path);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (s.ok()) s = st;
      }
    });
  }
  if (close(fd) != 0 && s.ok()) s = file_io::Error(path, "cannot close");
  if (!s.ok()) unlink(path.c_str());
  return s;
}

}  // namespace sync
}  // namespace arc_v3

// Local files as every layer writes them. A failed read,
// write, sync, resize or rename of a local file is kIoError naming the path and the
// system's reason (a full disk says "No space left on device"). Internal to the library.
#ifndef ARC_V3_SRC_COMMON_FILE_IO_H_
#define ARC_V3_SRC_COMMON_FILE_IO_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace file_io {

// kIoError "PATH: WHAT: <strerror(errno)>".
inline Status Error(const std::string& path, const char* what) {
  return Status(ErrorCode::kIoError, path + ": " + what + ": " + std::strerror(errno));
}

// pwrite of all `size` bytes at `offset` (interrupted and short writes resumed).
inline Status WriteAt(int fd, const uint8_t* data, uint64_t size, uint64_t offset,
                      const std::string& path) {
  while (size > 0) {
    const ssize_t n =
        pwrite(fd, data, std::min<uint64_t>(size, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error(path, "cannot write");
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Gives a new file its `size` bytes of disk up front, so that a full disk fails here
// rather than halfway through, or as a SIGBUS on a write through a mapping of the file.
// File systems that cannot reserve space get a sparse file of that size instead.
inline Status Reserve(int fd, uint64_t size, const std::string& path) {
  if (size == 0) return Status::Ok();
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    return ftruncate(fd, static_cast<off_t>(size)) == 0 ? Status::Ok()
                                                        : Error(path, "cannot resize");
  }
  if (rc == 0) return Status::Ok();
  errno = rc;
  return Error(path, "cannot reserve space");
}

// fsync of a directory, so that the names created, linked or renamed in it last.
inline Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error(dir, "cannot open directory");
  const int rc = fsync(fd);
  const int saved = errno;
  close(fd);
  errno = saved;
  return rc == 0 ? Status::Ok() : Error(dir, "cannot sync directory");
}

}  // namespace file_io
}  // namespace arc_v3

#endif  // ARC_V3_SRC_COMMON_FILE_IO_H_

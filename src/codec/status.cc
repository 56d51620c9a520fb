// Error names, Status formatting and version queries.
#include "arc_v3.hpp"
#include "src/codec/format.h"
#include "src/codec/kernels.h"

namespace arc_v3 {

uint32_t VersionNumber() { return ARC_V3_VERSION_NUMBER; }

const char* VersionString() {
#define ARC_V3_STR2(x) #x
#define ARC_V3_STR(x) ARC_V3_STR2(x)
  return ARC_V3_STR(ARC_V3_VERSION_MAJOR) "." ARC_V3_STR(ARC_V3_VERSION_MINOR) "." ARC_V3_STR(
      ARC_V3_VERSION_PATCH);
#undef ARC_V3_STR
#undef ARC_V3_STR2
}

uint32_t FormatVersion() { return kFormatVersion; }

const char* ErrorName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kSizeMismatch: return "size_mismatch";
    case ErrorCode::kTruncated: return "truncated";
    case ErrorCode::kBadMagic: return "bad_magic";
    case ErrorCode::kUnsupportedVersion: return "unsupported_version";
    case ErrorCode::kReservedBitsSet: return "reserved_bits_set";
    case ErrorCode::kCorruptHeader: return "corrupt_header";
    case ErrorCode::kCorruptChunk: return "corrupt_chunk";
    case ErrorCode::kCodecFailure: return "codec_failure";
    case ErrorCode::kChecksumMismatch: return "checksum_mismatch";
    case ErrorCode::kOutputTooSmall: return "output_too_small";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kWrongBase: return "wrong_base";
    case ErrorCode::kHistoryMismatch: return "history_mismatch";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kAlreadyExists: return "already_exists";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kPermissionDenied: return "permission_denied";
    case ErrorCode::kUntrusted: return "untrusted";
    case ErrorCode::kIoError: return "io_error";
    case ErrorCode::kMaxCode: break;
  }
  return "unknown_error";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(ErrorName(code_)) + ": " + message_;
}

const char* ActiveTarget() { return DispatchedTargetName(); }

}  // namespace arc_v3

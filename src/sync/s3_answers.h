// What the S3 and HTTP stores read of a server's answers (http_store.cc): header fields,
// S3's XML documents (errors, listings, multipart uploads; and the escaping of what the
// client writes into one), the Content-Range check of a range request, and the
// percent-encoded keys and queries of the requests' URLs. Apart from the transport
// so that they can be fuzzed (tests/fuzz). Every parser takes any bytes: what it cannot read is an
// error or an empty field, never a guess. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_S3_ANSWERS_H_
#define ARC_V3_SRC_SYNC_S3_ANSWERS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

// The header fields of one answer the client reads.
struct AnswerHeaders {
  std::string etag;
  uint64_t content_length = UINT64_MAX;  // UINT64_MAX: absent
  bool content_length_malformed = false;
  // Content-Range "bytes FIRST-LAST/TOTAL" (TOTAL "*": UINT64_MAX).
  bool has_range = false;
  bool range_malformed = false;
  uint64_t range_first = 0, range_last = 0, range_total = UINT64_MAX;
};

// Takes one header line (CRLF optional). A status line ("HTTP/...") starts a new answer
// (after 100-continue or a redirect) and clears `headers`.
void ParseHeaderLine(const char* data, size_t size, AnswerHeaders* headers);

// Whether a 206 answer to "Range: bytes=offset-(offset+size-1)" carries those bytes, or
// their start up to the object's end (then the caller finds the answer short).
bool RangeMatches(const AnswerHeaders& headers, uint64_t offset, uint64_t size);

// "Code: Message" of an S3 <Error> document, or "" if `body` is not one.
std::string S3ErrorText(const char* data, size_t size);

// One page of a ListObjectsV2 answer. Keys outside `prefix` + "/" (when `prefix` is not
// empty) or malformed (ValidKey) are not ours and are skipped; `prefix` is stripped.
struct ListingPage {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_token;
};
// kUnavailable (naming `what`) for an answer that is not a listing, an object without a
// well-formed Size, or a truncated page without a continuation token.
Status ParseListing(const char* data, size_t size, const std::string& prefix,
                    const std::string& what, ListingPage* page);

// The UploadId of an InitiateMultipartUploadResult; kUnavailable if there is none.
Status ParseUploadId(const char* data, size_t size, const std::string& what,
                     std::string* upload_id);

// `text` as XML character data (an ETag in the CompleteMultipartUpload document the
// client writes).
std::string XmlText(const std::string& text);

// RFC 3986 percent-encoding of everything but the unreserved characters (and '/' with
// `keep_slash`): keys in request paths and query parameters.
std::string PercentEncode(const std::string& text, bool keep_slash);
// "?a=1&b=2" with names and values encoded, sorted by name (SigV4's canonical query).
std::string CanonicalQuery(std::map<std::string, std::string> params);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_S3_ANSWERS_H_

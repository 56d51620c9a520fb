// Fuzz target: what the S3 and HTTP stores read of a server's answers (src/sync/s3_answers.h):
// header lines (ETag, Content-Length, Content-Range), S3 <Error> documents, ListObjectsV2
// pages and InitiateMultipartUpload answers. Input: one byte choosing the parser (and, for
// headers, 16 bytes of a range request), then the answer's bytes.
// Promises checked: no crash or out-of-bounds access; a refusal is an error with a message;
// a tag that goes back to the server has no control bytes; a listing yields only valid keys
// under the store's prefix; a truncated page has a token; a range is accepted only if it
// starts where asked and ends where asked or at the object's end.
#include <cstdint>
#include <cstring>
#include <string>

#include "src/sync/s3_answers.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {
namespace {

void CheckTag(const std::string& tag) {
  for (unsigned char c : tag)
    FUZZ_CHECK(c >= 0x20 && c < 0x7F, "a tag with control bytes was kept");
}

void FuzzHeaders(const uint8_t* data, size_t size) {
  uint64_t offset = 0, length = 0;
  if (size >= 16) {
    std::memcpy(&offset, data, 8);
    std::memcpy(&length, data + 8, 8);
    data += 16;
    size -= 16;
  }
  offset >>= 1;  // a request's range fits in 64 bits
  length = length % (UINT64_MAX - offset) + 1;
  sync::AnswerHeaders headers;
  const char* text = reinterpret_cast<const char*>(data);
  size_t begin = 0;
  while (begin < size) {
    const char* newline = static_cast<const char*>(std::memchr(text + begin, '\n', size - begin));
    const size_t end = newline != nullptr ? static_cast<size_t>(newline - text) + 1 : size;
    sync::ParseHeaderLine(text + begin, end - begin, &headers);
    begin = end;
  }
  CheckTag(headers.etag);
  FUZZ_CHECK(!headers.content_length_malformed || headers.content_length == UINT64_MAX,
             "a malformed Content-Length was taken");
  if (headers.has_range && !headers.range_malformed) {
    FUZZ_CHECK(headers.range_first <= headers.range_last, "a backwards Content-Range was taken");
    FUZZ_CHECK(headers.range_total == UINT64_MAX || headers.range_last < headers.range_total,
               "a Content-Range past the object's end was taken");
  }
  if (sync::RangeMatches(headers, offset, length)) {
    FUZZ_CHECK(headers.has_range && !headers.range_malformed && headers.range_first == offset,
               "a range starting elsewhere was accepted");
    FUZZ_CHECK(headers.range_last - offset < length, "a range longer than asked for was accepted");
    FUZZ_CHECK(
        headers.range_last - offset == length - 1 ||
            (headers.range_total != UINT64_MAX && headers.range_last + 1 == headers.range_total),
        "a short range was accepted before the object's end");
  }
}

}  // namespace

int FuzzS3Answers(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0];
  ++data;
  --size;
  const char* text = reinterpret_cast<const char*>(data);
  switch (which % 4) {
    case 0: FuzzHeaders(data, size); break;
    case 1: (void)sync::S3ErrorText(text, size); break;
    case 2: {
      const std::string prefix = (which & 4) ? "seed/runs/a" : "";
      sync::ListingPage page;
      const Status s = sync::ParseListing(text, size, prefix, "s3://bucket", &page);
      FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
      if (!s.ok()) break;
      for (const sync::ObjectInfo& o : page.objects) {
        FUZZ_CHECK(sync::ValidKey(o.key), "a malformed key was listed");
        CheckTag(o.etag);
      }
      FUZZ_CHECK(!page.truncated || !page.next_token.empty(), "a truncated page without a token");
      break;
    }
    default: {
      std::string upload_id;
      const Status s = sync::ParseUploadId(text, size, "s3://bucket/key", &upload_id);
      FUZZ_CHECK(s.ok() ? !upload_id.empty() : !s.message().empty(),
                 "an empty upload id or a silent error");
      break;
    }
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzS3Answers)

}  // namespace fuzz
}  // namespace arc_v3

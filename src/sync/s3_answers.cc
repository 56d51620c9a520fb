#include "src/sync/s3_answers.h"

#include <algorithm>
#include <cctype>
#include <pugixml.hpp>

namespace arc_v3 {
namespace sync {
namespace {

// A decimal number of at most 19 digits (below 10^19 < 2^64), nothing else.
bool ParseDecimal(const std::string& text, uint64_t* value) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *value = v;
  return true;
}

std::string Trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

// An ETag goes back to the server in If-None-Match: one with control or non-ASCII bytes
// is dropped (the object then counts as untagged) rather than sent.
std::string CleanTag(const std::string& tag) {
  for (unsigned char c : tag) {
    if (c < 0x20 || c >= 0x7F) return "";
  }
  return tag;
}

// "bytes FIRST-LAST/TOTAL" or "bytes FIRST-LAST/*".
bool ParseContentRange(const std::string& value, AnswerHeaders* h) {
  if (value.compare(0, 6, "bytes ") != 0) return false;
  const size_t dash = value.find('-', 6), slash = value.find('/', 6);
  if (dash == std::string::npos || slash == std::string::npos || dash > slash) return false;
  if (!ParseDecimal(value.substr(6, dash - 6), &h->range_first) ||
      !ParseDecimal(value.substr(dash + 1, slash - dash - 1), &h->range_last) ||
      h->range_last < h->range_first) {
    return false;
  }
  const std::string total = value.substr(slash + 1);
  if (total == "*") {
    h->range_total = UINT64_MAX;
    return true;
  }
  return ParseDecimal(total, &h->range_total) && h->range_last < h->range_total;
}

}  // namespace

void ParseHeaderLine(const char* data, size_t size, AnswerHeaders* headers) {
  std::string line(data, size);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.compare(0, 5, "HTTP/") == 0) {
    *headers = AnswerHeaders();
    return;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  const std::string value = Trim(line.substr(colon + 1));
  if (name == "etag") {
    headers->etag = CleanTag(value);
  } else if (name == "content-length") {
    uint64_t length = 0;
    headers->content_length_malformed = !ParseDecimal(value, &length);
    headers->content_length = headers->content_length_malformed ? UINT64_MAX : length;
  } else if (name == "content-range") {
    headers->has_range = true;
    headers->range_malformed = !ParseContentRange(value, headers);
  }
}

bool RangeMatches(const AnswerHeaders& h, uint64_t offset, uint64_t size) {
  if (!h.has_range || h.range_malformed || size == 0 || h.range_first != offset) return false;
  const uint64_t last = offset + size - 1;  // the caller's range fits in 64 bits
  if (h.range_last > last) return false;
  if (h.range_last == last) return true;
  return h.range_total != UINT64_MAX && h.range_last + 1 == h.range_total;  // the object ends there
}

std::string S3ErrorText(const char* data, size_t size) {
  pugi::xml_document doc;
  if (size == 0 || !doc.load_buffer(data, size)) return "";
  const pugi::xml_node error = doc.child("Error");
  if (!error) return "";
  std::string text = error.child_value("Code");
  const std::string message = error.child_value("Message");
  if (!message.empty()) text += (text.empty() ? "" : ": ") + message;
  return text;
}

Status ParseListing(const char* data, size_t size, const std::string& prefix,
                    const std::string& what, ListingPage* page) {
  *page = ListingPage();
  pugi::xml_document doc;
  if (!doc.load_buffer(data, size))
    return Status(ErrorCode::kUnavailable, what + ": the listing is not XML");
  const pugi::xml_node result = doc.child("ListBucketResult");
  if (!result)
    return Status(ErrorCode::kUnavailable, what + ": the answer is not a ListBucketResult");
  const std::string ours = prefix.empty() ? "" : prefix + "/";
  for (pugi::xml_node c : result.children("Contents")) {
    std::string key = c.child_value("Key");
    if (key.compare(0, ours.size(), ours) != 0) continue;
    key.erase(0, ours.size());
    if (!ValidKey(key)) continue;
    uint64_t object_size = 0;
    if (!ParseDecimal(Trim(c.child_value("Size")), &object_size)) {
      return Status(ErrorCode::kUnavailable,
                    what + ": the listing gives '" + key + "' no well-formed Size");
    }
    page->objects.push_back({key, object_size, CleanTag(c.child_value("ETag"))});
  }
  const std::string truncated = Trim(result.child_value("IsTruncated"));
  page->truncated = truncated == "true";
  if (page->truncated) {
    page->next_token = result.child_value("NextContinuationToken");
    if (page->next_token.empty()) {
      return Status(ErrorCode::kUnavailable,
                    what + ": a truncated listing without a continuation token");
    }
  }
  return Status::Ok();
}

Status ParseUploadId(const char* data, size_t size, const std::string& what,
                     std::string* upload_id) {
  upload_id->clear();
  pugi::xml_document doc;
  if (!doc.load_buffer(data, size))
    return Status(ErrorCode::kUnavailable, what + ": the answer is not XML");
  *upload_id = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
  if (upload_id->empty())
    return Status(ErrorCode::kUnavailable, what + ": no UploadId in the answer");
  return Status::Ok();
}

std::string XmlText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else
      out += c;
  }
  return out;
}

std::string PercentEncode(const std::string& text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(std::map<std::string, std::string> params) {
  std::string out;
  for (const auto& p : params)
    out += (out.empty() ? "?" : "&") + PercentEncode(p.first, false) + "=" +
           PercentEncode(p.second, false);
  return out;
}

}  // namespace sync
}  // namespace arc_v3

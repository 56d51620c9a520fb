// Strict reading of the JSON documents of the container (src/checkpoint/FORMAT.md) and the
// sync protocol (src/sync/PROTOCOL.md): only the fields a document lists, each of its type,
// or an error naming where.
// The helpers throw strict_json::Error, which each parser turns into a Status at its
// boundary.
#ifndef ARC_V3_SRC_CHECKPOINT_STRICT_JSON_H_
#define ARC_V3_SRC_CHECKPOINT_STRICT_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace arc_v3 {
namespace strict_json {

using Json = nlohmann::json;

struct Error {
  std::string what;
};
[[noreturn]] inline void Fail(const std::string& what) { throw Error{what}; }

// Parses one JSON text (RFC 8259), refusing an object that names a member twice: nlohmann
// keeps the last, other readers the first, and a document (a signed one above all) must
// have exactly one reading. Throws Error naming `where` for a repeated name, and
// Json::parse_error for text that is not JSON.
inline Json Parse(const char* begin, const char* end, const std::string& where) {
  std::vector<std::set<std::string>> names;  // of each object being read, innermost last
  std::string repeated;
  const Json::parser_callback_t note = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      names.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      names.pop_back();
    } else if (event == Json::parse_event_t::key && !names.empty() &&
               !names.back().insert(parsed.get<std::string>()).second && repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  Json doc = Json::parse(begin, end, note);
  if (!repeated.empty()) Fail(where + " names member '" + repeated + "' twice in one object");
  return doc;
}
inline Json Parse(const std::string& text, const std::string& where) {
  return Parse(text.data(), text.data() + text.size(), where);
}

// Rejects unknown fields like reserved bits: a newer writer must bump the version.
inline void CheckFields(const Json& object, const std::set<std::string>& allowed,
                        const std::string& where) {
  if (!object.is_object()) Fail(where + " is not an object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (allowed.count(it.key()) == 0) Fail(where + " has unknown field '" + it.key() + "'");
  }
}
inline const Json& Field(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) Fail(where + " lacks '" + key + "'");
  return *it;
}
inline uint64_t U64(const Json& value, const std::string& where) {
  if (!value.is_number_unsigned()) Fail(where + " is not an unsigned integer");
  return value.get<uint64_t>();
}
inline std::string Str(const Json& value, const std::string& where) {
  if (!value.is_string()) Fail(where + " is not a string");
  return value.get<std::string>();
}
// 16 lowercase hex digits (how the documents write 64-bit checksums).
inline uint64_t Hex(const Json& value, const std::string& where) {
  const std::string s = Str(value, where);
  if (s.size() != 16) Fail(where + " is not 16 hex digits");
  uint64_t v = 0;
  for (char c : s) {
    const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) Fail(where + " is not 16 lowercase hex digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace strict_json
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_STRICT_JSON_H_

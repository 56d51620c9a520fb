// A check the document targets share: an accepted JSON text names no member twice in one
// object (PROTOCOL.md: a document has exactly one reading). Read here through nlohmann's
// SAX interface, apart from the parsers' own check (src/checkpoint/strict_json.h).
#ifndef ARC_V3_TESTS_FUZZ_FUZZ_JSON_H_
#define ARC_V3_TESTS_FUZZ_FUZZ_JSON_H_

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

// Whether `text` is JSON with an object that names a member twice.
inline bool RepeatsMember(const std::string& text) {
  using Json = nlohmann::json;
  struct Names : nlohmann::json_sax<Json> {
    std::vector<std::set<std::string>> open;
    bool repeated = false;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override {
      open.emplace_back();
      return true;
    }
    bool key(string_t& name) override {
      repeated = repeated || !open.back().insert(name).second;
      return true;
    }
    bool end_object() override {
      open.pop_back();
      return true;
    }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } names;
  Json::sax_parse(text, &names);
  return names.repeated;
}

inline void CheckOneReading(const std::string& text) {
  FUZZ_CHECK(!RepeatsMember(text), "a JSON document naming a member twice was accepted");
}

}  // namespace fuzz
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_FUZZ_FUZZ_JSON_H_

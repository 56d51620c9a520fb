// ARC_V3_RETURN_IF_ERROR: the one way the library passes an error up, and
// ARC_V3_RETURN_IF_ERROR_IN, which says where it happened on the way. Internal to the
// library (users of arc_v3.hpp get no macros from it).
#ifndef ARC_V3_SRC_COMMON_STATUS_MACROS_H_
#define ARC_V3_SRC_COMMON_STATUS_MACROS_H_

#include <string>

#include "arc_v3.hpp"

namespace arc_v3 {

// `s` with "CONTEXT: " put before its message (the code kept; an ok `s` unchanged).
inline Status InContext(const std::string& context, const Status& s) {
  return s.ok() ? s : Status(s.code(), context + ": " + s.message());
}

}  // namespace arc_v3

// Evaluates `expr` (an arc_v3::Status) once and returns it from the enclosing function
// unless it is ok.
#define ARC_V3_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::arc_v3::Status arc_v3_status_ = (expr);        \
    if (!arc_v3_status_.ok()) return arc_v3_status_; \
  } while (0)

// As ARC_V3_RETURN_IF_ERROR, the error returned with "CONTEXT: " before its message;
// `context` (a std::string expression) is evaluated only on an error.
#define ARC_V3_RETURN_IF_ERROR_IN(context, expr)                                     \
  do {                                                                               \
    ::arc_v3::Status arc_v3_status_ = (expr);                                        \
    if (!arc_v3_status_.ok()) return ::arc_v3::InContext((context), arc_v3_status_); \
  } while (0)

#endif  // ARC_V3_SRC_COMMON_STATUS_MACROS_H_

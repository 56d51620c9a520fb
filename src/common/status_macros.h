// ARC_V3_RETURN_IF_ERROR: the one way the library passes an error up. Internal to the
// library (users of arc_v3.hpp get no macros from it).
#ifndef ARC_V3_SRC_COMMON_STATUS_MACROS_H_
#define ARC_V3_SRC_COMMON_STATUS_MACROS_H_

#include "arc_v3.hpp"

// Evaluates `expr` (an arc_v3::Status) once and returns it from the enclosing function
// unless it is ok.
#define ARC_V3_RETURN_IF_ERROR(expr)                \
  do {                                              \
    ::arc_v3::Status arc_v3_status_ = (expr);       \
    if (!arc_v3_status_.ok()) return arc_v3_status_; \
  } while (0)

#endif  // ARC_V3_SRC_COMMON_STATUS_MACROS_H_

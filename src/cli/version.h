// The version `sparkserve --version` and `sparkserve version` print.
#pragma once

#include <string>

#include "backend/backend_factory.h"

namespace sparkserve::cli {

inline constexpr const char* kVersion = "0.1.0";

inline std::string version_line() {
  return std::string("sparkserve ") + kVersion + (build_has_cuda() ? " (CUDA backend)" : " (CPU only: no CUDA backend in this build)");
}

}  // namespace sparkserve::cli

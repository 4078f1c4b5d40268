// Server log lines on stderr: "INFO 12-01 17:20:01.123 message", filtered by a global level
// (serve --log-level). One write per line, so lines from different threads never interleave.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sparkserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
// "debug" / "info" / "warning" (or "warn") / "error", case-insensitive.
std::optional<LogLevel> parse_log_level(std::string_view name);
void log_line(LogLevel level, std::string_view message);

}  // namespace sparkserve

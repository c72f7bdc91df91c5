// Levelled logging for the daemon and the store tools, on spdlog. One
// Logger is owned by whoever runs (the Filesystem, a CLI command) and passed
// by pointer; its spdlog logger is not registered in spdlog's global
// registry, so no global logger exists.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace ckptfs::fs {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Parses "debug|info|warn|error"; InvalidArgument status otherwise.
bool ParseLogLevel(std::string_view name, LogLevel* out);

// Writes "<time, UTC> <level> <message>" lines to stderr, a log file, or
// syslog (ident "ckptfs") once the daemon runs in the background.
// Thread safety: all methods may be called concurrently, except that the
// destination changes (OpenFile, UseSyslog) happen before other threads log.
class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kInfo);
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Logs to `path` (appending) from now on.
  bool OpenFile(const std::string& path);
  // Logs to syslog from now on (the daemon without log= once detached).
  void UseSyslog();
  void set_level(LogLevel level) { level_ = level; }
  bool enabled(LogLevel level) const { return level >= level_.load(std::memory_order_relaxed); }

  template <typename... Args>
  void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
    if (!enabled(level)) return;
    Write(level, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void Debug(fmt::format_string<Args...> f, Args&&... args) { Log(LogLevel::kDebug, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void Info(fmt::format_string<Args...> f, Args&&... args) { Log(LogLevel::kInfo, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void Warn(fmt::format_string<Args...> f, Args&&... args) { Log(LogLevel::kWarn, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void Error(fmt::format_string<Args...> f, Args&&... args) { Log(LogLevel::kError, f, std::forward<Args>(args)...); }

 private:
  void Write(LogLevel level, const std::string& message);

  std::atomic<LogLevel> level_;
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace ckptfs::fs

// Levelled logging for the daemon and the store tools. One Logger is owned
// by whoever runs (the Filesystem, a CLI command) and passed by pointer; no
// global logger exists.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace ckptfs::fs {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Parses "debug|info|warn|error"; InvalidArgument status otherwise.
bool ParseLogLevel(std::string_view name, LogLevel* out);

// Writes "<time> <level> <message>" lines to a FILE* (stderr or a log file).
// Thread safety: all methods may be called concurrently.
class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kInfo, std::FILE* sink = stderr) : level_(level), sink_(sink) {}
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Opens `path` for appending and logs there from now on (the Logger owns it).
  bool OpenFile(const std::string& path);
  void set_level(LogLevel level) { level_ = level; }
  bool enabled(LogLevel level) const { return level >= level_; }

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

  LogLevel level_;
  std::mutex mu_;  // leaf lock: serialises lines
  std::FILE* sink_;
  bool owns_sink_ = false;
};

}  // namespace ckptfs::fs

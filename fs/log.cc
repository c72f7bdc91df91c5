#include "fs/log.h"

#include <sys/time.h>

#include <ctime>

namespace ckptfs::fs {

bool ParseLogLevel(std::string_view name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warn") *out = LogLevel::kWarn;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

Logger::~Logger() {
  if (owns_sink_) std::fclose(sink_);
}

bool Logger::OpenFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "ae");
  if (f == nullptr) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (owns_sink_) std::fclose(sink_);
  sink_ = f;
  owns_sink_ = true;
  return true;
}

void Logger::Write(LogLevel level, const std::string& message) {
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  struct tm tm;
  ::gmtime_r(&tv.tv_sec, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(mu_);
  std::fprintf(sink_, "%s.%03ldZ %-5s %s\n", when, static_cast<long>(tv.tv_usec / 1000),
               kNames[static_cast<int>(level)], message.c_str());
  std::fflush(sink_);
}

}  // namespace ckptfs::fs

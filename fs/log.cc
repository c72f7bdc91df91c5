#include "fs/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>
#include <syslog.h>

namespace ckptfs::fs {
namespace {

std::shared_ptr<spdlog::logger> MakeLogger(spdlog::sink_ptr sink) {
  auto logger = std::make_shared<spdlog::logger>("ckptfs", std::move(sink));
  // Every line as it happens (a crash must not eat the last ones), in UTC.
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %v", spdlog::pattern_time_type::utc);
  logger->set_level(spdlog::level::trace);  // Logger filters by its own level
  logger->flush_on(spdlog::level::trace);
  return logger;
}

spdlog::level::level_enum ToSpd(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::err;
}

}  // namespace

bool ParseLogLevel(std::string_view name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warn") *out = LogLevel::kWarn;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

Logger::Logger(LogLevel level) : level_(level), logger_(MakeLogger(std::make_shared<spdlog::sinks::stderr_sink_mt>())) {}

Logger::~Logger() = default;

bool Logger::OpenFile(const std::string& path) {
  try {
    logger_ = MakeLogger(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false));
  } catch (const spdlog::spdlog_ex&) {
    return false;
  }
  return true;
}

void Logger::UseSyslog() {
  auto sink = std::make_shared<spdlog::sinks::syslog_sink_mt>("ckptfs", LOG_PID, LOG_DAEMON, /*enable_formatting=*/false);
  auto logger = std::make_shared<spdlog::logger>("ckptfs", std::move(sink));
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::trace);
  logger_ = std::move(logger);
}

void Logger::Write(LogLevel level, const std::string& message) {
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  try {
    // The level word in the text too (syslog gets it as the priority).
    logger_->log(ToSpd(level), fmt::format("{:<5} {}", kNames[static_cast<int>(level)], message));
  } catch (...) {
    // Logging never takes the daemon down.
  }
}

}  // namespace ckptfs::fs

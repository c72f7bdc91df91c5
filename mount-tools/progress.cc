#include "mount-tools/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ckptfs::tools {

bool ProgressWanted(bool quiet) { return !quiet && ::isatty(STDERR_FILENO) == 1; }

namespace {
std::chrono::milliseconds DrawInterval() {
  const char* env = std::getenv("CKPTFS_PROGRESS_MS");
  const long ms = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
  return std::chrono::milliseconds(ms > 0 && ms <= 60000 ? ms : 250);
}
}  // namespace

Progress::Progress(std::string label, uint64_t total, std::string unit, bool enabled)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)), enabled_(enabled), interval_(DrawInterval()) {
  if (enabled_) ticker_ = std::thread([this] { Run(); });
}

void Progress::Finish() {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  ticker_.join();
  std::fputs("\r\033[K", stderr);  // erase the line: the command's own output follows
  std::fflush(stderr);
}

void Progress::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  // The first draw after a moment: quick commands print nothing.
  while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) Draw();
}

void Progress::Draw() {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const uint64_t done = done_.load(std::memory_order_relaxed);
  std::string text;
  if (unit_.empty()) {
    text = fmt::format("{}: {:.1f} s", label_, seconds);
  } else if (unit_ == "bytes") {
    const double mb = static_cast<double>(done) / 1e6;
    text = total_ > 0 ? fmt::format("{}: {:.0f} % ({:.0f} of {:.0f} MB, {:.0f} MB/s, {:.1f} s)", label_,
                                    100.0 * static_cast<double>(done) / static_cast<double>(total_), mb,
                                    static_cast<double>(total_) / 1e6, seconds > 0 ? mb / seconds : 0.0, seconds)
                      : fmt::format("{}: {:.0f} MB, {:.1f} s", label_, mb, seconds);
  } else {
    text = total_ > 0 ? fmt::format("{}: {} of {} {}, {:.1f} s", label_, done, total_, unit_, seconds)
                      : fmt::format("{}: {} {}, {:.1f} s", label_, done, unit_, seconds);
  }
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
}

}  // namespace ckptfs::tools

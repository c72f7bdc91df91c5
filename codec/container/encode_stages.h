// Where an encode spends its time, stage by stage, and what the optional
// candidates (a row-column base for second moments, a low-rank term for
// first moments) win: every stage of the default encode has to pay for its
// time in bytes, and these figures say whether it does
// (`ckptfs encode --stages`, scripts/bench/codec_suite.py).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>

namespace ckptfs {

enum class EncodeStage {
  kBaseRead,      // the base's reconstruction of a chunk (a decode of the base blob)
  kPrediction,    // fitting and writing a prediction (step, scaled base, dither)
  kLossy,         // the lossy stream of a chunk (with the lossless candidates of a poor one)
  kRowColumn,     // second moments: the candidate against a row-column base
  kLowRank,       // first moments: the candidate with a low-rank term
  kStoredPass,    // the pass in file order: lossless chunks, checksums, output
  kCount,
};
inline std::string_view EncodeStageName(EncodeStage stage) {
  switch (stage) {
    case EncodeStage::kBaseRead: return "base_read";
    case EncodeStage::kPrediction: return "prediction";
    case EncodeStage::kLossy: return "lossy";
    case EncodeStage::kRowColumn: return "row_column";
    case EncodeStage::kLowRank: return "low_rank";
    case EncodeStage::kStoredPass: return "stored_pass";
    case EncodeStage::kCount: break;
  }
  return "?";
}

struct EncodeStageStat {
  double seconds = 0;    // summed over threads
  uint64_t calls = 0;    // chunks that went through the stage
  uint64_t kept = 0;     // candidates: chunks whose candidate was smaller and kept
  int64_t saved_bytes = 0;  // candidates: bytes the kept ones saved
};

struct EncodeStageStats {
  std::array<EncodeStageStat, static_cast<size_t>(EncodeStage::kCount)> stage{};
  EncodeStageStat& operator[](EncodeStage s) { return stage[static_cast<size_t>(s)]; }
  const EncodeStageStat& operator[](EncodeStage s) const { return stage[static_cast<size_t>(s)]; }
};

// Collects stage figures from the encoding threads.
// Thread safety: Add may be called concurrently.
class EncodeStageRecorder {
 public:
  // `counted`: the chunk went through the stage (not only its cheap checks).
  void Add(EncodeStage s, double seconds, bool counted = true, bool kept = false, int64_t saved_bytes = 0) {
    std::lock_guard lock(mu_);
    EncodeStageStat& stat = stats_[s];
    stat.seconds += seconds;
    if (counted) ++stat.calls;
    if (kept) {
      ++stat.kept;
      stat.saved_bytes += saved_bytes;
    }
  }
  EncodeStageStats Take() {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  std::mutex mu_;
  EncodeStageStats stats_;
};

// Seconds since construction (a steady clock).
class StageTimer {
 public:
  StageTimer() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ckptfs

// The log-domain mode of the lossy stream (LOSSY.md section 9), for update
// denominators such as Adam's exp_avg_sq: each positive element becomes the
// index of the nearest point of a geometric grid (a uniform grid in log2 v),
// which bounds every element's *relative* error. Exact zeros stay exact
// zeros; negative, -0, NaN and Inf elements are stored bit for bit. In a
// delta frame each index is coded as its difference from the index of the
// base's reconstructed element (closed loop): a slowly moving second moment
// gives mostly zero differences, which zstd collapses.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"

namespace ckptfs::lossy {

// The grid {m_j * 2^e}: per octave the levels m_0 = 1, m_j = m_{j-1} * ratio
// (binary64 products, so every machine builds the same table) while < 2.
// Index q stands for m_(q mod K) * 2^floor(q / K), K = levels per octave.
// Immutable. Thread safety: const methods are safe.
class LogGrid {
 public:
  // REQUIRES nothing: a ratio outside (1, 2] or one needing more than
  // kMaxLogLevels levels per octave is InvalidArgument.
  static Result<LogGrid> FromRatio(double ratio);
  // The ratio the encoder uses for a per-element relative bound: half a
  // step is then 0.95 * max_rel, the rest a margin for rounding the grid
  // point to the element type. Capped at 2.
  static double RatioFor(double max_rel);

  double ratio() const { return ratio_; }
  uint32_t per_octave() const { return per_octave_; }
  // The index of the grid point nearest to x (ties to the lower point).
  // REQUIRES: x finite and > 0.
  int64_t Index(double x) const;
  // The grid point of index q (0 or +Inf far outside the double range).
  double Value(int64_t q) const;

 private:
  double ratio_ = 2.0;
  uint32_t per_octave_ = 1;
  std::vector<double> mantissa_;  // m_0..m_{K-1}, ascending in [1, 2), then 2.0 (the next octave's m_0)
  // For a speed-up only (results equal a binary search): bucket b covers
  // mantissas [1 + b/B, 1 + (b+1)/B) and holds the last level <= 1 + b/B.
  // B >= 2K, so a bucket holds at most one level boundary.
  std::vector<uint32_t> bucket_level_;
  uint32_t bucket_shift_ = 52;  // 52 - log2(B): mantissa bits >> shift = bucket
};

// Encodes a chunk in log mode with |w_hat - w| <= max_rel * |w| for every
// element. Returns nullopt when the stream would not be smaller than the
// raw values (the caller stores the chunk losslessly). `recon_out` as in
// EncodeOptions::reconstruction_out.
// REQUIRES: max_rel > 0, base empty or values.size(), n < 2^32.
Result<std::optional<EncodedChunk>> EncodeLogChunk(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                   Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out);

// Decodes the body of a log-mode stream (everything after the header, the
// checksum already removed and verified). `base` is empty unless h is a
// delta frame, then out.size() bytes.
Status DecodeLogBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                     Scratch::Buffers& s);

}  // namespace ckptfs::lossy

// A rANS plane (rans.h) decoded a piece at a time, so that a caller can use
// each piece while it is still in L1 (merge it with the other byte planes,
// put the zero elements back) instead of decoding the whole plane to memory
// and reading it back. The same bytes and the same errors as RansDecode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "codec/common/bytes.h"
#include "codec/common/simd_level.h"
#include "codec/common/status.h"
#include "codec/tensor/rans_model.h"

namespace ckptfs {

// Thread safety: none; one owner. Holds the 16 KiB decode table: keep it
// on the stack or in a long-lived object, not in a container that copies.
class RansStreamDecoder {
 public:
  RansStreamDecoder() = default;
  RansStreamDecoder(const RansStreamDecoder&) = delete;
  RansStreamDecoder& operator=(const RansStreamDecoder&) = delete;

  // Starts decoding `stored`, a stream of n bytes (`stored` must outlive
  // the decoding). REQUIRES: CpuHasSimd(level).
  Status Open(ByteSpan stored, size_t n, std::string_view what, SimdLevel level = BestSimdLevel());

  // Decodes the next `count` bytes of the plane into out[0, count). Pieces
  // that start at a multiple of rans::kStates take the vector path.
  // REQUIRES: Open succeeded; count <= the bytes not yet decoded.
  Status Next(uint8_t* out, size_t count);


  // Checks that the whole plane was decoded and the stream ends exactly there.
  Status Finish() const;

 private:
  rans::DecodeTable table_;
  rans::StreamStart stream_;
  size_t n_ = 0;
  size_t done_ = 0;
  SimdLevel level_ = SimdLevel::kScalar;
  std::string what_;
};

}  // namespace ckptfs

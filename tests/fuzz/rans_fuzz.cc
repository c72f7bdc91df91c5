// libFuzzer target for the rANS plane coder. The first two input bytes give
// the plane length (up to 64 KiB), the rest is a stream: every decoder the
// CPU runs (scalar, AVX2, AVX-512) must return a status without crashing or
// reading out of bounds, and all must agree; so must the piece-by-piece
// decoder (rans_stream.h), in pieces whose sizes the stream bytes pick.
// The stream bytes are also encoded as a plane and
// must decode back to themselves, the same from every encoder path; so must
// a context plane (rans_context.h) with contexts from the bytes' positions.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/tensor/rans.h"
#include "codec/tensor/rans_context.h"
#include "codec/tensor/rans_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  if (size < 2) return 0;
  const size_t n = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8;
  ByteSpan stored(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  std::vector<uint8_t> fast(n), slow(n);
  Status a = RansDecode(stored, fast.data(), n, "fuzz");
  Status b = RansDecodeWith(SimdLevel::kScalar, stored, slow.data(), n, "fuzz");
  if (a.code() != b.code()) std::abort();
  if (a.ok() && fast != slow) std::abort();
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<uint8_t> other(n);
    Status c = RansDecodeWith(level, stored, other.data(), n, "fuzz");
    if (c.code() != b.code() || (c.ok() && other != slow)) std::abort();
  }
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<uint8_t> other(n);
    RansStreamDecoder stream;
    Status c = stream.Open(stored, n, "fuzz", level);
    for (size_t at = 0, p = 0; c.ok() && at < n; ++p) {
      // Sizes 1-96 from the stream's own bytes: on and off group boundaries.
      const size_t pick = stored.empty() ? 32 : 1 + static_cast<uint8_t>(stored[p % stored.size()]) % 96;
      const size_t piece = pick < n - at ? pick : n - at;
      c = stream.Next(other.data() + at, piece);
      at += piece;
    }
    if (c.ok()) c = stream.Finish();
    if (c.code() != b.code() || (c.ok() && other != slow)) std::abort();
  }

  const uint8_t* plane = data + 2;
  const size_t count = size - 2;
  if (count == 0) return 0;
  // At most one word per byte, plus table and states: this always fits.
  std::vector<std::byte> encoded(2 * count + 1024);
  Result<size_t> m = RansEncode(plane, count, CountBytes(plane, count), encoded.data(), encoded.size());
  if (!m.ok()) std::abort();
  // Every encoder the CPU runs writes the same bytes.
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<std::byte> other(encoded.size());
    Result<size_t> k = RansEncodeWith(level, plane, count, CountBytes(plane, count), other.data(), other.size());
    if (!k.ok() || *k != *m || std::memcmp(other.data(), encoded.data(), *m) != 0) std::abort();
  }
  if (CpuHasSimd(SimdLevel::kAvx512)) {
    std::vector<std::byte> other(encoded.size());
    Result<size_t> k = RansEncodeAvx512WithoutIfma(plane, count, CountBytes(plane, count), other.data(), other.size());
    if (!k.ok() || *k != *m || std::memcmp(other.data(), encoded.data(), *m) != 0) std::abort();
  }
  std::vector<uint8_t> back(count);
  if (!RansDecode(ByteSpan(encoded).first(*m), back.data(), count, "fuzz").ok()) std::abort();
  if (std::memcmp(back.data(), plane, count) != 0) std::abort();

  // Context planes: the stream bytes decoded in 16 contexts (any status,
  // no crash), and the plane coded in them must decode back.
  std::vector<uint8_t> ids(count > n ? count : n);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint8_t>((i * 7 + (i >> 3)) % 16);
  std::vector<uint32_t> tables;
  (void)RansDecodeInContexts(stored, ByteContexts{ids.data(), 16}, slow.data(), n, "fuzz", &tables);
  // Room for 16 full tables besides the words.
  std::vector<std::byte> coded(2 * count + 16 * 600 + 1024);
  Result<size_t> c = RansEncodeInContexts(plane, count, ByteContexts{ids.data(), 16}, coded.data(), coded.size());
  if (!c.ok()) std::abort();
  if (!RansDecodeInContexts(ByteSpan(coded).first(*c), ByteContexts{ids.data(), 16}, back.data(), count, "fuzz",
                            &tables)
           .ok() ||
      std::memcmp(back.data(), plane, count) != 0)
    std::abort();
  return 0;
}

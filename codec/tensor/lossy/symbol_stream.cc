#include "codec/tensor/lossy/symbol_stream.h"

#include <algorithm>
#include <string>

#include "codec/tensor/lossy/kernels_cpu_simd.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/rans.h"

namespace ckptfs::lossy {
namespace {

// Symbol i of `bits` (1..8) at bits [i*bits, i*bits + bits) of `packed`, one
// byte each into out[0, n); eight symbols are b whole bytes.
void UnpackSymbols(ByteSpan packed, unsigned bits, uint64_t n, uint8_t* out) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const std::byte* in = packed.data();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8, in += bits) {
    uint64_t group = 0;
    for (unsigned k = 0; k < bits; ++k) group |= static_cast<uint64_t>(in[k]) << (8 * k);
    for (unsigned j = 0; j < 8; ++j) out[i + j] = static_cast<uint8_t>((group >> (j * bits)) & mask);
  }
  if (i < n) {
    const uint64_t tail_bytes = ((n - i) * bits + 7) / 8;
    uint64_t group = 0;
    for (unsigned k = 0; k < tail_bytes; ++k) group |= static_cast<uint64_t>(in[k]) << (8 * k);
    for (unsigned j = 0; i + j < n; ++j) out[i + j] = static_cast<uint8_t>((group >> (j * bits)) & mask);
  }
}

// The inverse of UnpackSymbols over all of `packed` (zero past the symbols);
// the OR of all symbols goes to *ored (a symbol wider than `bits` shows
// there). Eight symbols of b bits are b whole bytes: with BMI2 one PEXT per
// group, else a group at a time.
void PackSymbols(const uint8_t* in, uint64_t n, unsigned bits, MutableByteSpan packed, uint32_t* ored) {
  uint8_t any = 0;
  for (uint64_t i = 0; i < n; ++i) any |= in[i];
  std::byte* out = packed.data();
  const uint64_t full = n / 8 * 8;
  if (!PackGroupsBmi2(in, full, bits, out)) {
    for (uint64_t i = 0; i < full; i += 8, out += bits) {
      uint64_t group = 0;
      for (unsigned j = 0; j < 8; ++j) group |= static_cast<uint64_t>(in[i + j]) << (j * bits);
      for (unsigned k = 0; k < bits; ++k) out[k] = std::byte((group >> (8 * k)) & 0xff);
    }
  } else {
    out += full / 8 * bits;
  }
  if (full < n) {
    uint64_t group = 0;
    for (unsigned j = 0; full + j < n; ++j) group |= static_cast<uint64_t>(in[full + j]) << (j * bits);
    const uint64_t tail_bytes = ((n - full) * bits + 7) / 8;
    for (unsigned k = 0; k < tail_bytes; ++k) *out++ = std::byte((group >> (8 * k)) & 0xff);
  }
  std::fill(out, packed.data() + packed.size(), std::byte{0});
  *ored = any;
}

}  // namespace

Result<SymbolStream> CompressSymbols(Scratch::Buffers& s, int zstd_level, ByteSpan packed, unsigned bits, uint64_t n) {
  ASSIGN_OR_RETURN(ByteSpan zstd, CompressZstd(s.cctx.get(), zstd_level, packed, &s.zstd_main));
  if (bits > kMaxRansBits || n == 0 || zstd.size() < 2) return SymbolStream{zstd, false};
  EnsureSize(&s.symbols, n);
  UnpackSymbols(packed, bits, n, s.symbols.data());
  // Only a plane smaller than the zstd frame is worth it; RansEncode says
  // Unsupported when it would not fit in that.
  EnsureSize(&s.rans_main, zstd.size() - 1);
  Result<size_t> size = RansEncode(s.symbols.data(), n, CountBytes(s.symbols.data(), n), s.rans_main.data(),
                                   zstd.size() - 1);
  if (!size.ok()) {
    if (size.status().code() == StatusCode::kUnsupported) return SymbolStream{zstd, false};
    return size.status();
  }
  return SymbolStream{ByteSpan(s.rans_main.data(), *size), true};
}

Status DecompressSymbols(Scratch::Buffers& s, bool rans, ByteSpan main, unsigned bits, uint64_t n,
                         MutableByteSpan packed, const char* what) {
  if (!rans) return Unzstd(s.dctx.get(), main, packed.data(), packed.size(), what);
  if (bits < 1 || bits > kMaxRansBits || (n * bits + 7) / 8 > packed.size())
    return Status::Internal(std::string("lossy chunk: ") + what + ": " + std::to_string(n) + " symbols of " +
                            std::to_string(bits) + " bits into " + std::to_string(packed.size()) + " bytes");
  EnsureSize(&s.symbols, n);
  RETURN_IF_ERROR(RansDecode(main, s.symbols.data(), n, what));
  uint32_t ored = 0;
  PackSymbols(s.symbols.data(), n, bits, packed, &ored);
  if ((ored >> bits) != 0)
    return Status::Corruption(std::string("lossy chunk: ") + what + ": a symbol wider than " + std::to_string(bits) +
                              " bits");
  return Status::Ok();
}

}  // namespace ckptfs::lossy

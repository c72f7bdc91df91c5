#include "codec/tensor/lossy/symbol_stream.h"

#include <algorithm>
#include <string>

#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/rans.h"

namespace ckptfs::lossy {
namespace {

// Symbol i of `bits` (1..8) at bits [i*bits, i*bits + bits) of `packed`, one
// byte each into out[0, n).
void UnpackSymbols(ByteSpan packed, unsigned bits, uint64_t n, uint8_t* out) {
  if (bits == 8) {
    std::copy_n(reinterpret_cast<const uint8_t*>(packed.data()), n, out);
    return;
  }
  const uint32_t mask = (1u << bits) - 1;
  uint64_t acc = 0;
  unsigned held = 0;
  size_t at = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (held < bits) {
      acc |= static_cast<uint64_t>(packed[at++]) << held;
      held += 8;
    }
    out[i] = static_cast<uint8_t>(acc & mask);
    acc >>= bits;
    held -= bits;
  }
}

// The inverse of UnpackSymbols over all of `packed` (zero past the symbols);
// the largest symbol goes to *max_symbol.
void PackSymbols(const uint8_t* in, uint64_t n, unsigned bits, MutableByteSpan packed, uint32_t* max_symbol) {
  uint32_t top = 0;
  uint64_t acc = 0;
  unsigned held = 0;
  std::byte* out = packed.data();
  for (uint64_t i = 0; i < n; ++i) {
    top = std::max<uint32_t>(top, in[i]);
    acc |= static_cast<uint64_t>(in[i]) << held;
    held += bits;
    if (held >= 8) {
      *out++ = std::byte(acc & 0xff);
      acc >>= 8;
      held -= 8;
    }
  }
  if (held > 0) *out++ = std::byte(acc & 0xff);
  std::fill(out, packed.data() + packed.size(), std::byte{0});
  *max_symbol = top;
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
  uint32_t max_symbol = 0;
  PackSymbols(s.symbols.data(), n, bits, packed, &max_symbol);
  if (max_symbol >= (1u << bits))
    return Status::Corruption(std::string("lossy chunk: ") + what + ": symbol " + std::to_string(max_symbol) +
                              " wider than " + std::to_string(bits) + " bits");
  return Status::Ok();
}

}  // namespace ckptfs::lossy

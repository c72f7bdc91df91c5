#include "codec/tensor/lossy/symbol_stream.h"

#include <algorithm>
#include <string>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/symbol_groups.h"
#include "codec/tensor/rans.h"

namespace ckptfs::lossy {
namespace {

// Symbol i of `bits` (1..8) at bits [i*bits, i*bits + bits) of `packed`, one
// byte each into out[0, n): the whole groups, then the last partial one.
void UnpackSymbols(ByteSpan packed, unsigned bits, uint64_t n, uint8_t* out) {
  const uint64_t full = n / kPackGroup * kPackGroup;
  UnpackGroups(packed.data(), full, bits, out);
  if (full == n) return;
  // (The log mode's bit string ends within the last group.)
  std::byte group[kPackGroup] = {};
  const ByteSpan tail = packed.subspan(full / kPackGroup * bits);
  std::copy_n(tail.begin(), std::min<size_t>(bits, tail.size()), group);
  uint8_t symbols[kPackGroup];
  UnpackGroups(group, kPackGroup, bits, symbols);
  std::copy(symbols, symbols + (n - full), out + full);
}

// The inverse of UnpackSymbols over all of `packed` (zero past the symbols).
void PackSymbols(const uint8_t* in, uint64_t n, unsigned bits, MutableByteSpan packed) {
  const uint64_t full = n / kPackGroup * kPackGroup;
  PackGroups(in, full, bits, packed.data(), /*use_simd=*/true);
  std::byte* out = packed.data() + full / kPackGroup * bits;
  if (full < n) {
    uint8_t symbols[kPackGroup] = {};
    std::copy(in + full, in + n, symbols);
    std::byte group[kPackGroup];
    PackGroups(symbols, kPackGroup, bits, group, /*use_simd=*/false);
    out = std::copy_n(group, ((n - full) * bits + 7) / 8, out);
  }
  std::fill(out, packed.data() + packed.size(), std::byte{0});
}

}  // namespace

Result<SymbolStream> CompressSymbols(Scratch::Buffers& s, int zstd_level, ByteSpan packed, unsigned bits, uint64_t n,
                                     ByteContexts contexts) {
  ASSIGN_OR_RETURN(ByteSpan zstd, CompressZstd(s.cctx.get(), zstd_level, packed, &s.zstd_main));
  if (bits > kMaxRansBits || n == 0 || zstd.size() < 2) return SymbolStream{zstd, false};
  EnsureSize(&s.symbols, n);
  UnpackSymbols(packed, bits, n, s.symbols.data());
  // Only a plane smaller than the zstd frame is worth it; RansEncode says
  // Unsupported when it would not fit in that.
  SymbolStream best{zstd, false};
  EnsureSize(&s.rans_main, zstd.size() - 1);
  Result<size_t> size = RansEncode(s.symbols.data(), n, CountBytes(s.symbols.data(), n), s.rans_main.data(),
                                   zstd.size() - 1);
  if (size.ok()) {
    best = SymbolStream{ByteSpan(s.rans_main.data(), *size), true};
  } else if (size.status().code() != StatusCode::kUnsupported) {
    return size.status();
  }
  if (contexts.empty() || best.bytes.size() < 2) return best;
  EnsureSize(&s.rans_contexts, best.bytes.size() - 1);
  size = RansEncodeInContexts(s.symbols.data(), n, contexts, s.rans_contexts.data(), best.bytes.size() - 1);
  if (size.ok()) return SymbolStream{ByteSpan(s.rans_contexts.data(), *size), true, true};
  if (size.status().code() != StatusCode::kUnsupported) return size.status();
  return best;
}

Result<ByteSpan> DecodeSymbolBytes(Scratch::Buffers& s, ByteSpan main, unsigned bits, uint64_t n, const char* what,
                                   const ByteContexts* contexts) {
  if (bits < 1 || bits > kMaxRansBits)
    return Status::Internal(std::string("lossy chunk: ") + what + ": rANS symbols of " + std::to_string(bits) +
                            " bits");
  const uint64_t padded = (n + kPackGroup - 1) / kPackGroup * kPackGroup;
  EnsureSize(&s.symbols, padded);
  if (contexts != nullptr) {
    RETURN_IF_ERROR(RansDecodeInContexts(main, *contexts, s.symbols.data(), n, what, &s.rans_context_tables));
  } else {
    RETURN_IF_ERROR(RansDecode(main, s.symbols.data(), n, what));
  }
  std::fill(s.symbols.begin() + static_cast<ptrdiff_t>(n), s.symbols.begin() + static_cast<ptrdiff_t>(padded), 0);
  return ByteSpan(reinterpret_cast<const std::byte*>(s.symbols.data()), padded);
}

Status DecompressSymbols(Scratch::Buffers& s, bool rans, ByteSpan main, unsigned bits, uint64_t n,
                         MutableByteSpan packed, const char* what, const ByteContexts* contexts) {
  if (!rans) return Unzstd(s.dctx.get(), main, packed.data(), packed.size(), what);
  if (bits < 1 || bits > kMaxRansBits || (n * bits + 7) / 8 > packed.size())
    return Status::Internal(std::string("lossy chunk: ") + what + ": " + std::to_string(n) + " symbols of " +
                            std::to_string(bits) + " bits into " + std::to_string(packed.size()) + " bytes");
  RETURN_IF_ERROR(DecodeSymbolBytes(s, main, bits, n, what, contexts).status());
  uint8_t ored = 0;  // a symbol wider than `bits` shows here (packing would drop its high bits)
  for (uint64_t i = 0; i < n; ++i) ored |= s.symbols[i];
  if ((ored >> bits) != 0)
    return Status::Corruption(std::string("lossy chunk: ") + what + ": a symbol wider than " + std::to_string(bits) +
                              " bits");
  PackSymbols(s.symbols.data(), n, bits, packed);
  return Status::Ok();
}

}  // namespace ckptfs::lossy

// DecodeChunk: parses and checks the stream (LOSSY.md), then unpacks and
// dequantizes through the kernels and patches the exact elements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/common/hash.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/symbol_stream.h"
#include "codec/tensor/lossy/trellis.h"

namespace ckptfs::lossy {
namespace {

Status Corrupt(const std::string& what, uint64_t want, uint64_t have) {
  return Status::Corruption("lossy chunk: " + what + ", want=" + std::to_string(want) +
                            " have=" + std::to_string(have));
}

}  // namespace

Status DecodeChunk(ElementType type, ByteSpan encoded, ByteSpan base, MutableByteSpan out, Scratch* scratch,
                   LossyKernels* kernels, std::optional<uint64_t>* checksum, ByteContexts contexts,
                   const BaseSlices* base_slices, const SliceFinish* finish) {
  if (checksum != nullptr) checksum->reset();
  const size_t width = ElementSize(type);
  if (encoded.size() < StreamHeader::kFixedPrefix + kTrailerSize)
    return Corrupt("stream size at least", StreamHeader::kFixedPrefix + kTrailerSize, encoded.size());
  const uint64_t stored_sum = LoadLE64(encoded.data() + encoded.size() - kTrailerSize);
  encoded = encoded.first(encoded.size() - kTrailerSize);
  const uint64_t actual_sum = Checksum64(encoded);
  if (stored_sum != actual_sum)
    return Status::ChecksumMismatch("lossy chunk: checksum, want=" + std::to_string(stored_sum) +
                                    " have=" + std::to_string(actual_sum));
  ASSIGN_OR_RETURN(StreamHeader h, StreamHeader::DecodeFrom(encoded));
  if (h.type != type) return Corrupt("element type", static_cast<uint8_t>(type), static_cast<uint8_t>(h.type));
  if (out.size() % width != 0 || out.size() / width != h.element_count)
    return Corrupt("element count", out.size() / width, h.element_count);
  // A chunk encoded against a base may still be a key frame (when that was
  // smaller); its decoder then ignores the base.
  const bool delta = (h.flags & kFlagDelta) != 0;
  if ((base_slices != nullptr && !base.empty()) || ((base_slices != nullptr || finish != nullptr) && type != ElementType::kF32))
    return Status::InvalidArgument("lossy decode: a sliced base or a finish is of f32 elements, and a sliced base alone");
  if (delta && base_slices != nullptr && base_slices->elements() * 4 != out.size())
    return Corrupt("delta frame base size", out.size(), base_slices->elements() * 4);
  if (delta && base_slices == nullptr && base.size() != out.size())
    return Corrupt("delta frame base size", out.size(), base.size());
  if (!delta) {
    base = {};
    base_slices = nullptr;
  }
  const uint64_t n = h.element_count;

  Scratch::Buffers& s = scratch->buffers();
  // The log and quantized decoders on the CPU take a base and a finish
  // slice by slice; the others (and a device backend, which decodes a
  // chunk in one call) a whole base, and the finish after the chunk.
  const bool by_slices = kernels == nullptr && (h.mode == StreamMode::kLog || h.mode == StreamMode::kQuantized);
  if (base_slices != nullptr && !by_slices) {
    EnsureSize(&s.base_whole, out.size());
    base_slices->Fill(0, n, s.base_whole.data());
    base = ByteSpan(s.base_whole.data(), out.size());
    base_slices = nullptr;
  }
  const SliceFinish* slice_finish = by_slices ? finish : nullptr;
  const SliceFinish* whole_finish = by_slices ? nullptr : finish;
  if (!s.dctx) s.dctx.reset(ZSTD_createDCtx());
  if (!s.dctx) return Status::NoMemory("lossy decode: zstd context");
  if (!s.cpu_kernels) s.cpu_kernels = MakeCpuKernels();
  LossyKernels& k = kernels ? *kernels : *s.cpu_kernels;

  // The CPU kernels decode in slices that are hashed while in cache; a
  // device backend decodes the chunk in one call (the caller hashes it).
  // (Not where a finish comes after the whole chunk: it changes the bytes.)
  std::optional<Checksum64Stream> hash;
  if (checksum != nullptr && kernels == nullptr && h.mode != StreamMode::kLossless && whole_finish == nullptr)
    hash.emplace();
  if (h.mode == StreamMode::kLog) {
    RETURN_IF_ERROR(DecodeLogBody(type, h, encoded.subspan(h.size), base, out, s,
                                  SimdLevel::kAvx512, hash ? &*hash : nullptr, base_slices, slice_finish));
    if (hash) *checksum = hash->Digest();
    return Status::Ok();
  }
  if (h.mode == StreamMode::kTrellis) {
    RETURN_IF_ERROR(DecodeTrellisBody(type, h, encoded.subspan(h.size), base, out, s,
                                      hash ? &*hash : nullptr));
    if (whole_finish != nullptr) whole_finish->Apply(0, n, out.data());
    if (hash) *checksum = hash->Digest();
    return Status::Ok();
  }
  ByteReader r(encoded, "lossy chunk");
  r.Skip(h.size);
  if (h.mode == StreamMode::kLossless) {
    ByteSpan main = r.Bytes(h.main_size);
    RETURN_IF_ERROR(r.status());
    if (r.remaining() != 0) return Corrupt("trailing bytes", 0, r.remaining());
    if (n == 0)
      return h.main_size == 0 || Unzstd(s.dctx.get(), main, nullptr, 0, "planes").ok()
                 ? Status::Ok()
                 : Status::Corruption("lossy chunk: empty planes stream is not zstd");
    EnsureSize(&s.planes, out.size());
    RETURN_IF_ERROR(Unzstd(s.dctx.get(), main, s.planes.data(), out.size(), "planes"));
    JoinPlanes(ByteSpan(s.planes.data(), out.size()), base, width, out);
    if (whole_finish != nullptr) whole_finish->Apply(0, n, out.data());
    return Status::Ok();
  }

  float levels[kMaxLevels] = {};
  for (uint32_t j = 0; j < h.num_levels; ++j) {
    levels[j] = BitsFloat(r.U32());
    if (!r.ok()) break;
    if (!std::isfinite(levels[j]))
      return Status::Corruption("lossy chunk: level " + std::to_string(j) + " is not finite");
    if (j > 0 && !(levels[j] > levels[j - 1]))
      return Status::Corruption("lossy chunk: levels not strictly ascending at " + std::to_string(j));
  }
  ByteSpan main = r.Bytes(h.main_size);
  ByteSpan exact_z = r.Bytes(h.exact_size);
  RETURN_IF_ERROR(r.status());
  if (r.remaining() != 0) return Corrupt("trailing bytes", 0, r.remaining());

  if (h.SymbolsHaveContexts() && contexts.empty())
    return Status::Corruption("lossy chunk: symbols coded in contexts that only a dithered chunk has");
  // A rANS plane's symbols are bytes already: dequantized as 8-bit symbols
  // (the same values), not packed to h.bits first (the packing was a
  // twentieth of a delta chain's decode). A symbol wider than h.bits is
  // above num_levels (< 2^bits): the check after the slices rejects it.
  uint32_t symbol_bits = h.bits;
  ByteSpan symbols;
  if (h.SymbolsAreRans() && h.bits <= kMaxRansBits) {
    ASSIGN_OR_RETURN(symbols, DecodeSymbolBytes(s, main, h.bits, n, "symbols",
                                                h.SymbolsHaveContexts() ? &contexts : nullptr));
    symbol_bits = 8;
  } else {
    const uint64_t packed_bytes = PackedBytes(n, h.bits);
    EnsureSize(&s.packed, packed_bytes);
    RETURN_IF_ERROR(DecompressSymbols(s, h.SymbolsAreRans(), main, h.bits, n,
                                      MutableByteSpan(s.packed.data(), packed_bytes), "symbols",
                                      h.SymbolsHaveContexts() ? &contexts : nullptr));
    symbols = ByteSpan(s.packed.data(), packed_bytes);
  }
  ASSIGN_OR_RETURN(ExactPatcher exact, ExactPatcher::Open(s.dctx.get(), exact_z, h, width, &s.exact_list));
  uint32_t max_symbol = 0;
  if (base_slices != nullptr) EnsureSize(&s.base_slice, kDecodeSliceElements * width);
  auto dequantize = [&](uint64_t first, uint64_t count) {
    // Every slice starts on a byte of the packed symbols (first is a multiple of 8).
    const uint64_t at = first * symbol_bits / 8;
    uint32_t slice_max = 0;
    ByteSpan slice_base = base.empty() ? base : base.subspan(first * width, count * width);
    if (base_slices != nullptr) {  // made here, in cache, just before its slice
      base_slices->Fill(first, count, s.base_slice.data());
      slice_base = ByteSpan(s.base_slice.data(), count * width);
    }
    Status done = k.Dequantize(type, symbol_bits, levels, symbols.subspan(at), slice_base,
                               out.subspan(first * width, count * width), &slice_max);
    max_symbol = std::max(max_symbol, slice_max);
    return done;
  };
  RETURN_IF_ERROR(DecodeInSlices(n, width, exact, hash ? &*hash : nullptr, out, dequantize,
                                 /*sliced=*/base_slices != nullptr, slice_finish));
  if (whole_finish != nullptr) whole_finish->Apply(0, n, out.data());
  if (max_symbol > h.num_levels) return Corrupt("symbols <= levels", h.num_levels, max_symbol);
  if (hash) *checksum = hash->Digest();
  return Status::Ok();
}

}  // namespace ckptfs::lossy

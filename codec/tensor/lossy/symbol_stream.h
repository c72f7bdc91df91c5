// The main stream of a quantized or log-mode chunk (LOSSY.md sections 5.3
// and 5.7): the packed symbols as one zstd frame (stream versions 1 and 2),
// or, one byte per symbol, as a rANS plane (version 3, FORMAT.md "rANS
// plane"), whichever is smaller.
//
// Why both: zstd's Huffman stage codes bytes, and when b does not divide 8
// a packed byte holds pieces of two or three symbols; on the eval's
// checkpoints zstd spent 7 % (b = 2 or 3, quantized) to 37 % (b = 5, log
// mode) more than the symbols' entropy, which rANS codes within a fraction
// of a percent. zstd wins where its matches remove long runs that order-0
// coding cannot (frozen regions).
#pragma once

#include <cstdint>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/rans_context.h"

namespace ckptfs::lossy {

struct SymbolStream {
  ByteSpan bytes;     // in a buffer of the scratch, valid until its next use
  bool rans = false;  // a rANS plane: the header's version is kStreamVersionRans
  bool contexts = false;  // a context rANS plane (kStreamVersionRansContexts)
};

// Codes the n symbols of `bits` each in `packed` (the bit string of LOSSY.md
// section 5.3, its length the mode's packed size). With `contexts` (one per
// symbol), a context rANS plane is a third candidate.
Result<SymbolStream> CompressSymbols(Scratch::Buffers& s, int zstd_level, ByteSpan packed, unsigned bits, uint64_t n,
                                     ByteContexts contexts = {});

// Restores all of `packed` from a main stream coded as `rans` says (with
// `contexts` not null: a context rANS plane coded in those contexts); the
// bits past the n symbols are zero. A rANS plane holding a symbol of more
// than `bits` bits is Corruption.
Status DecompressSymbols(Scratch::Buffers& s, bool rans, ByteSpan main, unsigned bits, uint64_t n,
                         MutableByteSpan packed, const char* what, const ByteContexts* contexts = nullptr);

// A rANS plane's n symbols as bytes, in s.symbols and returned, zero from
// n up to the next multiple of 8: the packing of 8-bit symbols (LOSSY.md
// 5.3), so a decoder dequantizes them as they are instead of packing them
// to `bits` (1..kMaxRansBits) first. Their range is the caller's to check
// (the quantized decoder's symbols at most its level count, which is below
// 2^bits).
Result<ByteSpan> DecodeSymbolBytes(Scratch::Buffers& s, ByteSpan main, unsigned bits, uint64_t n, const char* what,
                                   const ByteContexts* contexts = nullptr);

}  // namespace ckptfs::lossy

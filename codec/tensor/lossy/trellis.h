// Trellis-coded quantization (stream mode 3, LOSSY.md section 11).
//
// Why: a scalar quantizer with entropy-coded symbols stays about a quarter
// of a bit per element above the rate-distortion bound at the rates a
// delta frame of weights runs at (0.3-1.5 bits): on a character LM's
// weight residual at an error of 0.54 of its energy, 0.72 bits where the
// bound for a Gaussian of that variance is 0.45. Trellis-coded quantization (Marcellin and
// Fischer; the entropy-constrained form of Fischer and Wang, also the
// "dependent quantization" of H.266/VVC) recovers most of it with a
// decoder that stays a table lookup per element: the reconstruction
// levels are the multiples j·Δ of a step, each element picks from either
// the even or the odd multiples depending on a small state machine driven
// by the indices before it, and the encoder chooses the whole sequence of
// indices by a Viterbi search that weighs each element's squared error
// against its coded bits. The symbols are coded in a context rANS plane
// whose context is the state (codec/tensor/rans_context.h).
//
// The encoder runs on the host for either kernel backend (a Viterbi search
// is sequential over the elements); it is tried after the quantized mode's
// search and kept only when its stream is smaller.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"

namespace ckptfs::lossy {

// The state machine (LOSSY.md section 11): eight states; state s takes the
// multiples 2k + (s & 1) of the step; the next state follows from s and the
// parity of k.
inline constexpr uint32_t kTrellisStates = 8;
// Symbol of an element kept exact (its bits are in the exact list); for the
// state machine it counts as k = 0.
inline constexpr uint8_t kTrellisExactSymbol = 255;
// Indices k are in [-kTrellisMaxIndex, kTrellisMaxIndex], coded as
// zigzag(k) = 2k for k >= 0, -2k - 1 for k < 0 (0..254).
inline constexpr int32_t kTrellisMaxIndex = 127;

inline uint8_t TrellisNext(uint32_t state, int32_t k) {
  // Rows: state; columns: k even, k odd (Ungerboeck's 8-state trellis).
  static constexpr uint8_t kNext[kTrellisStates][2] = {{0, 1}, {2, 3}, {5, 4}, {7, 6},
                                                       {1, 0}, {3, 2}, {4, 5}, {6, 7}};
  return kNext[state][k & 1];
}
inline int32_t TrellisMultiple(uint32_t state, int32_t k) { return 2 * k + static_cast<int32_t>(state & 1); }
inline uint8_t TrellisZigzag(int32_t k) { return static_cast<uint8_t>(k >= 0 ? 2 * k : -2 * k - 1); }
inline int32_t TrellisUnzigzag(uint8_t s) { return (s & 1) != 0 ? -static_cast<int32_t>((s + 1) / 2) : s / 2; }

// Tries the trellis mode for a chunk whose quantized-mode stream took
// `size_to_beat` bytes: `residual` is the chunk's residual (LOSSY.md
// section 2, against `base`, empty for a key frame), `norm_sq` the squared
// norm of the finite values, `allowed_sq` the error it must stay within
// (measured on the reconstruction in the codec's reduction order). nullopt
// when no trellis stream within the budget is smaller; else the chunk,
// with its reconstruction in `recon` (values.size() bytes; left undefined
// on nullopt) and stats filled but for the budget fields.
Result<std::optional<EncodedChunk>> EncodeTrellisChunk(ElementType type, ByteSpan values, ByteSpan base,
                                                       std::span<const float> residual, double norm_sq,
                                                       double allowed_sq, size_t size_to_beat,
                                                       Scratch::Buffers& s, int zstd_level, MutableByteSpan recon);

// Decodes a mode-3 stream: `body` is everything after the header (the
// step, the main and exact streams); `base` is empty for a key frame.
// With `hash`, the output is hashed as it is written.
Status DecodeTrellisBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                         Scratch::Buffers& s, Checksum64Stream* hash);

}  // namespace ckptfs::lossy

// The lossy tensor chunk codec (DynaQuant-style): every element of a chunk is
// pruned (stored as 0, or "unchanged" in a delta frame), quantized to one of
// up to 2^b - 1 non-uniform levels, or kept exact (outliers, NaN, +-Inf). A
// per-chunk configuration search picks the bits, prune threshold and outlier
// fraction that minimise the encoded size under an error budget. The stream
// format and the algorithm are specified in codec/tensor/lossy/LOSSY.md.
//
// All functions are pure over spans and deterministic: the same input gives
// the same bytes on every machine and on either kernel backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy/base_slices.h"
#include "codec/tensor/rans_context.h"

namespace ckptfs::lossy {

class LossyKernels;
struct BudgetSchedule;

// Element types the codec transforms. Values equal the matching DType so the
// two convert trivially. Stored in the stream: never renumber.
enum class ElementType : uint8_t {
  kF32 = 1,   // IEEE binary32, little-endian
  kF16 = 2,   // IEEE binary16 as its raw 16-bit pattern, little-endian
  kBF16 = 3,  // bfloat16 as its raw 16-bit pattern, little-endian
};
// Size in bytes of one element (4 or 2).
size_t ElementSize(ElementType type);
// The ElementType of a codec float DType (f32, f16, bf16), else InvalidArgument.
Result<ElementType> ElementTypeOf(DType dtype);

// Error budget of a tensor (applied per chunk, which implies it per tensor:
// squared errors and squared norms both add over chunks).
struct Budget {
  double rel_l2 = 0.0;   // max ||w_hat - w|| / ||w|| over finite elements (0 = unused)
  double max_abs = 0.0;  // max |w_hat - w| (0 = unused)
  // Per-element relative bound |w_hat - w| <= max_rel * |w| (0 = unused).
  // Selects the log-domain mode (LOSSY.md section 9), meant for update
  // denominators such as Adam's exp_avg_sq; it is used alone (the other two
  // fields 0). All three 0: lossless.
  double max_rel = 0.0;
  // The rel_l2 that applies instead when a first moment is coded in step
  // space, measured on Adam's step m / (sqrt(v) + eps) (the container's
  // step_space.h); 0 = rel_l2. Chunks coded as they are keep rel_l2.
  double step_rel_l2 = 0.0;

  bool lossy() const { return rel_l2 > 0 || max_abs > 0 || max_rel > 0; }
};

// What the encoder did, measured on the actual reconstruction.
struct ChunkStats {
  double rel_l2 = 0.0;     // achieved ||w_hat - w|| / ||w|| (0 when ||w|| = 0 and exact)
  double max_abs = 0.0;    // achieved max |w_hat - w| over finite elements
  double max_rel = 0.0;    // log mode: achieved max |w_hat - w| / |w| over its quantized elements
  uint8_t bits = 0;        // symbol width; 0 = lossless mode (log mode: up to 24)
  uint8_t mode = 0;        // the stream's mode (StreamMode): 0 lossless, 1 quantized, 2 log
  uint64_t pruned = 0;     // elements stored as 0 / unchanged
  uint64_t quantized = 0;  // elements mapped to a level
  uint64_t exact = 0;      // elements stored bit for bit (outliers, NaN, Inf, log mode's zeros, or all in lossless mode)
  // The budget the chunk was encoded to (the configured one, or tighter
  // under a BudgetSchedule), and the measured relative update
  // ||w - base|| / ||w|| the schedule saw (0 when it did not measure one).
  Budget budget;
  double update_rel = 0.0;
  // The sums behind rel_l2, in the codec's reduction order (LOSSY.md §2):
  // sum (w_hat - w)^2 and sum w^2 over the finite elements. ref2_sum is 0
  // only when the budget was lossless (nothing measured).
  double err2_sum = 0.0;
  double ref2_sum = 0.0;
  // The stream is a delta frame against EncodeOptions::alternative_base,
  // not against the `base` argument (its estimate was smaller).
  bool used_alternative_base = false;
};

struct EncodedChunk {
  std::vector<std::byte> bytes;           // the self-describing stream
  std::vector<std::byte> reconstruction;  // exactly what DecodeChunk returns
  ChunkStats stats;
};

// Reusable buffers. Reusing one Scratch across calls avoids fresh-memory
// costs (a large share of the run time for 4 MB chunks).
// Thread safety: one Scratch per thread; it is not shared.
class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  struct Buffers;
  Buffers& buffers() { return *buffers_; }

 private:
  std::unique_ptr<Buffers> buffers_;
};

// The most EncodeOptions::unbiased_levels may raise a chunk's error, as a
// multiple of its rel_l2 budget: at the default 0.5 on a first moment's
// step, levels at their cells' centroids need about 1 / sqrt(1 - 0.5^2) =
// 1.15 to be unbiased; pruning needs more.
inline constexpr double kUnbiasAllowance = 1.25;

struct EncodeOptions {
  int zstd_level = 1;
  // Kernel backend; nullptr = the CPU reference. The GPU backend comes from
  // gpu/lossy_backend.h SelectLossyKernels(). Both produce identical bytes.
  LossyKernels* kernels = nullptr;
  // When not empty, the reconstruction is written here (its size must be
  // values.size()) and EncodedChunk::reconstruction stays empty: callers
  // that keep reconstructions in their own buffers avoid a fresh allocation.
  MutableByteSpan reconstruction_out;
  // When set and enabled, a delta frame's budget follows its measured update
  // (schedule.h); ChunkStats::budget says what was applied.
  const BudgetSchedule* schedule = nullptr;
  // The values are bit-identical to the original that `base` reconstructs
  // (the base chunk's source digest matched): the true update is zero (a
  // frozen tensor), so the schedule leaves the budget alone. Measured
  // against the reconstruction, the "update" would be the base's own
  // quantization error, and the schedule would spend bits re-encoding
  // unchanged values closer to themselves, version after version.
  bool source_unchanged = false;
  // f32, quantized mode with a rel_l2 budget (not a uniform grid, no
  // max_abs): the levels are scaled by the chunk's unbiasing gain
  // (level_gain.h), so the reconstruction is not shrunk toward the base on
  // average. The budget holds for the levels as searched, before the gain
  // (so for the direction of the reconstruction's residual: no rescaling of
  // it is further from the residual than they are); the gain may raise the
  // error to `unbias_allowance` times the budget, and is lowered where it
  // would go further. A shrunk first moment shortened every step after a
  // restore, shrunk weights lag behind their run (docs/eval.md "What one
  // restore does", "The encoder's unbiased moments").
  bool unbiased_levels = false;
  // At least 1: 1 keeps the error within the budget (the gain then uses
  // only the room the search left); kUnbiasAllowance for first moments.
  double unbias_allowance = kUnbiasAllowance;
  // The schedule's measured update ||w - base|| / ||w||, when the caller
  // measured it against another reference than `base`: a step-predicted
  // chunk passes its prediction as `base`, but its update is still the one
  // from the previous version (else the schedule would hold the error to
  // half of what the prediction leaves, not half of the update).
  std::optional<double> measured_update;
  // A second base to try for a delta frame (empty: none): the chunk is
  // coded against whichever of the two gives the smaller estimated size
  // (ChunkStats::used_alternative_base says which). A step-predicted chunk
  // passes the prediction as `base` and the previous version as this: a
  // residual with less energy is not always cheaper (at a tight budget its
  // shape matters more than its size).
  ByteSpan alternative_base;
  // When > 0 (a delta frame only): quantize the residual to the uniform
  // grid of this step (UniformGridConfig) instead of searching, with no
  // other base tried. The container's dithered first moments pass a
  // prediction with the dither already subtracted, so that the error is
  // uniform and independent of the values. On a budget miss the step
  // shrinks to fit.
  float uniform_step = 0.0f;
  // Contexts of the elements' symbols (n ids; empty: none): a quantized
  // stream may then code its symbols in a context rANS plane (stream
  // version 4), which DecodeChunk can only read with the same contexts. A
  // dithered chunk passes its offsets' buckets (dither.h): its symbols'
  // odds depend on them.
  ByteContexts symbol_contexts;
  // Also try trellis-coded quantization (LOSSY.md section 11, stream mode
  // 3) for a chunk with an L2 budget alone, and keep it when its stream is
  // smaller. Runs on the host for either backend.
  bool trellis = false;
};

// Encodes one chunk. `values` holds n elements of `type`; `base` is empty for
// a key frame, or the base version's *reconstructed* n elements for a delta
// frame (the residual values - base is quantized: closed loop).
// The reconstruction is within `budget` (guaranteed: when no lossy
// configuration fits, the chunk is stored losslessly). With a base whose
// residual is large, the chunk may be stored as a key frame when that is
// estimated smaller; decoding still takes the same base (and ignores it).
// REQUIRES: values.size() % ElementSize(type) == 0, n < 2^32,
//           base.empty() || base.size() == values.size(), budget fields >= 0.
// Thread safety: reentrant; concurrent calls need distinct scratch/kernels.
Result<EncodedChunk> EncodeChunk(ElementType type, ByteSpan values, ByteSpan base, const Budget& budget,
                                 Scratch* scratch, const EncodeOptions& options = {});

// Decodes a stream made by EncodeChunk into `out` (n elements of `type`).
// `base` must be the same base the encoder was given (it may be empty when
// the stream is a key frame; it is ignored then).
// Corrupt or truncated input gives a Corruption status, never a crash.
// With `checksum`, the quantized and log modes on the CPU kernels write,
// patch and hash the output slice by slice while it is in cache and set
// *checksum to XXH3-64 of all of `out` (the chunk checksum); other paths
// leave it empty.
// REQUIRES: out.size() is the chunk's byte size.
// Thread safety: reentrant; concurrent calls need distinct scratch/kernels.
// `contexts`: the EncodeOptions::symbol_contexts the chunk was encoded with
// (a stream in version 4 without them is Corruption).
// `base_slices`: an f32 base made on demand (base empty): the log and
// quantized modes on the CPU read it a slice at a time, the others have it
// made whole first. `finish`: applied to each decoded slice of an f32
// chunk (after its exact elements, before its hash), or to the whole chunk
// where the decoder does not work in slices (the checksum is then empty).
Status DecodeChunk(ElementType type, ByteSpan encoded, ByteSpan base, MutableByteSpan out, Scratch* scratch,
                   LossyKernels* kernels = nullptr, std::optional<uint64_t>* checksum = nullptr,
                   ByteContexts contexts = {}, const BaseSlices* base_slices = nullptr,
                   const SliceFinish* finish = nullptr);

}  // namespace ckptfs::lossy

// Mixed precision keeps two copies of the weights in one checkpoint: the
// model's bf16 (or f16) weights, and the optimizer's fp32 master copy they
// are rounded from (Megatron's model_optim_rng.pt, a custom trainer's
// "fp32_master" list). Coded apart, the weights are paid for twice. Coded
// as a copy (FORMAT.md "Step prediction", inputs bit `copy`), a chunk of
// the low-precision weights is a delta frame against its master's
// reconstruction rounded to the weights' type, and costs what the rounding
// of that reconstruction leaves outside the budget: next to nothing.
//
// The file names neither side after the other (a state_dict names the
// weights, an optimizer's state names parameters by index), so the pairs
// are found by evidence: the same element count, and sampled values that
// are the master's rounded. A wrong pair only costs bytes: the chunk's
// error is measured against its own values whatever it is predicted from.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/format/layout.h"
#include "codec/optimizer/step_sources.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// Elements sampled per pair, and how many must match for the pair to be
// taken (rounding differences: a master updated after the weights were
// rounded, by a step too small to change most of them).
inline constexpr uint64_t kCopySamples = 64;
inline constexpr uint64_t kCopyMinMatches = 56;

// Per tensor of `layout` (over `file`): the index of the f32 tensor whose
// rounded values it holds, or -1. Copies are little-endian bf16/f16
// tensors stored as one segment; a master is a little-endian f32 tensor
// stored as one segment, serves at most one copy, and is never a copy
// itself. `eligible[t]` (one per tensor) limits the copies to tensors the
// caller codes lossily; `excluded[t]` removes candidates on both sides
// (an optimizer's moments, whose values never match but cost a sample).
std::vector<int32_t> FindMasterCopies(const Layout& layout, ByteSpan file, const std::vector<bool>& eligible,
                                      const std::vector<bool>& excluded);

// The prediction of a copy's chunk (`values`, n elements of `type`) from its
// master's reconstruction `master` (n f32 elements at `master_offset` in the
// file): the master rounded to the type, as a decoder computes it, in
// scratch.prediction (scratch.step_inputs[2] holds the zero base it reads).
// `base`, the chunk's base reconstruction (empty in a key frame), gives the
// update for the budget schedule; a key frame has none.
ChunkPrediction PredictCopy(lossy::ElementType type, ByteSpan values, ByteSpan base, ByteSpan master,
                            uint64_t master_offset, CodecScratch& scratch);

}  // namespace ckptfs

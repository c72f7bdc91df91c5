// The encoder's side of step prediction (codec/tensor/lossy/step_predictor.h):
// which tensors of a checkpoint hold an optimizer's per-parameter state, and,
// for one chunk of weights, which of them belong to it and whether the
// prediction they give is worth storing.
//
// A PyTorch optimizer's state_dict names its state by parameter index
// ("optimizer.state.3.exp_avg"), not by the parameter's name, and the order
// of a torch zip's records is not the parameters' order. The state of a
// chunk of weights is therefore found by evidence: among the state tensors
// with the same element count, the one whose step direction correlates best
// with the weights' update. A wrong or missing match only costs bytes: the
// chunk's error is measured against its own values whatever it is predicted
// from.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// One parameter's optimizer state: "<p>.exp_avg" with "<p>.exp_avg_sq"
// (Adam, AdamW), or "<p>.momentum_buffer" alone (SGD, v = -1). Indices into
// Layout::tensors; both are little-endian f32/f16/bf16 of one dtype, each
// stored as a single segment.
struct StepStateTensors {
  int32_t m = -1;
  int32_t v = -1;
};

// Every such state in `layout`, and which tensors they are (is_state).
struct StepStates {
  std::vector<StepStateTensors> states;
  std::vector<bool> is_state;     // per tensor: an m or v of some state
  std::vector<bool> is_momentum;  // per tensor: an m of some state
  std::vector<std::optional<uint64_t>> tensor_offset;  // per tensor: offset of its single segment
  std::vector<uint64_t> tensor_elements;               // per tensor: its element count
};
StepStates FindStepStates(const Layout& layout);

// Per tensor of `layout`: the offset of its segment when it is stored as
// exactly one (StepStates::tensor_offset).
std::vector<std::optional<uint64_t>> SingleSegmentOffsets(const Layout& layout);

// One candidate's inputs for a chunk: this version's m and v ranges (in the
// reconstructed file being written) and, when the base holds the same
// state tensors, their offsets in the base.
struct StepCandidate {
  lossy::ElementType state_type = lossy::ElementType::kF32;
  uint64_t m_offset = 0, v_offset = 0;
  bool has_v = false;
  std::optional<uint64_t> m_base_offset, v_base_offset;
};

// What a predicted chunk is encoded against.
struct ChunkPrediction {
  ByteSpan prediction;     // in scratch.prediction
  double update_rel = 0;   // ||w - base|| / ||w||, for the budget schedule
  StepPrediction step;     // for the chunk's parameters
};

// Chooses the best-correlated candidate for the chunk `values` (n elements
// of `weight_type`, whose base reconstruction is `base`), reads its base
// inputs with `read_base` (a failed read drops the base-step term), fits the
// predictor and keeps it when the prediction leaves at most
// kMaxPredictedEnergy of the update's energy. `recon` is the reconstructed
// file (this version's state already final in it). Uses scratch.step_inputs
// [2..3] and scratch.prediction. nullopt: encode against the base as usual.
// Nearly any gain: the codec still compares the prediction with the previous
// version (EncodeOptions::alternative_base) by estimated size. (0.8 before
// 2026-12-02 dropped predictions that leave 80-90 % of the update, which on
// the eval's character LM still coded its weight matrices 10-15 % smaller.)
inline constexpr double kMaxPredictedEnergy = 0.99;
// Chunks below this many elements are not predicted: a prediction's
// parameters (72 bytes more than a plain chunk's) would outweigh what it
// saves (a 9 kB blob of a small MLP grew by 2 % with them).
inline constexpr uint64_t kMinPredictedElements = 4096;
// The base's bytes at [offset, +buffer.size()): in place where its reader
// has them in memory (kept valid by *hold), else read into `buffer`
// (BlobReader::ViewAt).
using BaseViewer = std::function<Result<ByteSpan>(uint64_t offset, MutableByteSpan buffer,
                                                   std::shared_ptr<const void>* hold)>;
std::optional<ChunkPrediction> PredictChunk(lossy::ElementType weight_type, ByteSpan values, ByteSpan base,
                                            ByteSpan recon, const std::vector<StepCandidate>& candidates,
                                            const BaseViewer& read_base, CodecScratch& scratch);

// A first moment m (Adam's exp_avg, SGD's momentum_buffer) decays by beta1
// per step between versions: the chunk `values` predicted as scale * base
// (scale fitted by least squares), kept when it leaves at most
// kMaxPredictedEnergy of the update's energy. Uses scratch.prediction.
// In the runs of docs/eval.md (5 steps between checkpoints) the prediction
// leaves 46 % of m's energy where the base itself leaves 69 %.
std::optional<ChunkPrediction> PredictScaledBase(lossy::ElementType type, ByteSpan values, ByteSpan base,
                                                 CodecScratch& scratch);

// The scaled base of a step-space first moment that a term is added to
// (a low-rank term, a dither): scale * base_x with the scale fitted by least
// squares (0 when none fits), as a decoder computes it, in
// scratch.prediction, kept whether or not it helps; with the update
// ||x - base_x|| / ||x|| and ||x||^2. nullopt when x is zero or a sum is not
// finite (a base holding Inf). x and base_x: f32, the same size.
struct ScaledBase {
  ChunkPrediction prediction;  // prediction.prediction is `values`
  MutableByteSpan values;
  double x2 = 0.0;
};
std::optional<ScaledBase> FitScaledBase(ByteSpan x, ByteSpan base_x, CodecScratch& scratch);

}  // namespace ckptfs

// The encoder's side of a dithered first moment (codec/tensor/lossy/
// dither.h; FORMAT.md "Dither"): an exp_avg chunk in step space coded
// against scale * base minus a pseudo-random dither, its residual rounded
// to a uniform grid, so that what the reconstruction loses is noise
// independent of the step instead of the step's own structure.
#pragma once

#include <cstdint>
#include <optional>

#include "codec/common/bytes.h"
#include "codec/optimizer/step_sources.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// The budget a dithered chunk is checked against, as a multiple of its
// relative error: the grid's error is within a few percent of the target
// on any chunk of more than a few thousand elements (uniform errors), and a
// miss shrinks the step.
inline constexpr double kDitherBudgetSlack = 1.25;

struct DitheredPrediction {
  ChunkPrediction prediction;  // scale * base_x - the dither, in scratch.prediction
  DitherTerm dither;
  float grid_step = 0.0f;      // the stream's grid (dither.step as a float)
  ByteContexts contexts;       // its symbols' contexts, in scratch.symbol_contexts
};

// x and base_x: the chunk and its base in step space (f32, same size);
// rel: the relative error ||x_hat - x|| / ||x|| to aim at, the grid step
// being rel * sqrt(12 * sum x^2 / n); seed: of the dither's offsets (the
// writer passes the chunk's source digest, distinct per version). nullopt
// as FitScaledBase, or for a step that is not a positive float. Uses
// scratch.prediction and scratch.symbol_contexts.
std::optional<DitheredPrediction> PredictDithered(ByteSpan x, ByteSpan base_x, double rel, uint64_t seed,
                                                  CodecScratch& scratch);

}  // namespace ckptfs

// The lossy chunks of one encode (codec/container/blob_writer.cc calls
// EncodeLossyChunks once, before it writes any chunk): where a checkpoint's
// tensors are coded together. The passes follow what each chunk reads:
//   1. chunks that need nothing else of this file (second moments among
//      them, with their row-column candidate; weights when there is no
//      optimizer state to predict them; a first moment against its decayed
//      base when not in step space);
//   2. first moments in step space (they read their second moment's
//      reconstruction; with their dither or low-rank candidates);
//   3. weights against their prediction from the optimizer state (they read
//      both moments' reconstructions);
//   4. bf16/f16 weights as copies of their fp32 master in the same file
//      (they read the master's reconstruction; master_copies.h).
// f32 weights that an earlier file's blob holds too are coded in the first
// pass as ref copies of that blob's reconstruction (ref_copies.h).
// Each stage is timed in the encode's EncodeStageRecorder (`ckptfs encode
// --stages`); the candidates themselves are in this folder
// (step_sources.h, step_space.h, dither_candidate.h, low_rank_candidate.h)
// and in codec/tensor/lossy/ (row_column_base.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/container/blob.h"
#include "codec/container/chunk_plan.h"
#include "codec/container/encode_stages.h"
#include "codec/format/layout.h"
#include "codec/optimizer/ref_copies.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// A chunk encoded lossily before the main pass (its reconstruction decides
// the zip CRCs written into verbatim chunks that may come before it).
struct LossyResult {
  bool used = false;  // false: the lossless candidates were smaller
  std::vector<std::byte> stored;
  LossyChunkParams params;
};

// Runs body(i, scratch) for i in [0, count) on up to `max_threads` threads,
// each with scratch of its own.
using ParallelFor =
    std::function<void(size_t count, unsigned max_threads, const std::function<void(size_t, CodecScratch&)>& body)>;

struct LossyPassesInput {
  ByteSpan file;
  const Layout& layout;
  const std::vector<PlannedChunk>& plan;
  const BaseRef* base;  // null: no base
  const std::vector<std::optional<uint64_t>>& base_match;  // MatchBaseTensors (empty without a base)
  const EncodeOptions& options;
  unsigned threads;
  const ParallelFor& parallel;
  EncodeStageRecorder& stages;
  // The earlier file's blob that the chunks with a ref_offset read (null:
  // none; ref_copies.h).
  const RefCandidate* ref = nullptr;
};

// Encodes every lossy chunk of `in.plan`: `recon` (the file's size) gets the
// whole reconstructed file (a lossy chunk's reconstruction, or the bytes
// of any other chunk and of a lossy one whose lossless candidates won),
// `*results` one LossyResult per chunk, and (*tensor_err2)[t] /
// (*tensor_ref2)[t] each tensor's error and reference energies. The zip
// CRCs in `recon` are the caller's to rewrite.
Status EncodeLossyChunks(const LossyPassesInput& in, MutableByteSpan recon, std::vector<LossyResult>* results,
                         std::vector<double>* tensor_err2, std::vector<double>* tensor_ref2);

}  // namespace ckptfs

// The encoder's plan of a blob (blob_writer.cc): the chunks a file is cut
// into, what each reads from the base version, and which optimizer state
// may predict it or put it in step space.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/container/blob.h"
#include "codec/optimizer/step_sources.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

struct PlannedChunk {
  uint64_t offset = 0;
  uint64_t length = 0;
  DType dtype = DType::kU8;
  std::optional<uint64_t> base_offset;  // set when the base holds this range
  lossy::Budget budget;                 // all 0: lossless
  int32_t tensor = -1;
  // Set when the ref holds this range's values (a ref copy,
  // codec/optimizer/ref_copies.h): their logical offset there.
  std::optional<uint64_t> ref_offset;
  bool lossy() const { return budget.lossy(); }
};

// The base tensor's offset for each tensor of `layout` that the base holds
// with the same name, dtype, shape and byte order, each as one segment of
// the same length; nullopt otherwise.
std::vector<std::optional<uint64_t>> MatchBaseTensors(const Layout& layout, const BlobReader& base);

// For each chunk, the logical offset of its second moment's range when it
// is coded in step space (step_space.h): a lossy f32 first moment of Adam
// under an L2 budget alone whose state has an f32 second moment, of a tensor of
// at least kMinStepSpaceElements (all its chunks, so that its budget is on
// the step throughout). nullopt: coded as it is.
std::vector<std::optional<uint64_t>> StepSpaceSources(const Layout& layout, const StepStates& states,
                                                      const std::vector<PlannedChunk>& plan);

// The base's reconstructed bytes for `plan`: in place where its reader has
// them in memory (held by scratch.base_hold until the next call), else read
// into scratch.base; empty when there is no base range or it cannot be read.
ByteSpan ReadBaseBytes(const PlannedChunk& plan, const BaseRef* base, CodecScratch& scratch);

// The optimizer states that may predict chunk `plan` (a tensor that no state
// is): those with as many elements as its tensor, as ranges of the same
// elements, with their offsets in the base when the base holds them too.
std::vector<StepCandidate> StepCandidates(const Layout& layout, const StepStates& states,
                                          const std::vector<std::optional<uint64_t>>& base_match,
                                          const PlannedChunk& plan);

// A chunk's source digest (recorded in its parameters) and whether the base
// was made from the same values (a frozen range). Hashed once per chunk: the
// prediction and the encoder both ask.
struct SourceMatch {
  uint64_t digest = 0;
  bool unchanged = false;
};
SourceMatch MatchSource(const PlannedChunk& plan, const BaseRef* base, ByteSpan data, ByteSpan base_bytes);

}  // namespace ckptfs

#include "codec/container/chunk_plan.h"

#include <string_view>
#include <unordered_map>

#include "codec/common/hash.h"
#include "codec/optimizer/step_space.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

// The source digest the base recorded for exactly the range `plan` reads
// from it (LossyChunkParams::source_digest); 0 when it has none: no base
// range, another chunk layout, a chunk not stored lossily, or parameters
// written before version 3.
uint64_t BaseSourceDigest(const PlannedChunk& plan, const BaseRef& base) {
  const std::vector<ChunkInfo>& chunks = base.reader->chunks();
  if (!plan.base_offset || chunks.empty()) return 0;
  const uint32_t c = ChunkIndexAt(chunks, *plan.base_offset);
  const ChunkInfo& info = chunks[c];
  if (info.codec != ChunkCodec::kLossy || info.logical_offset != *plan.base_offset ||
      info.logical_length != plan.length)
    return 0;
  Result<LossyChunkParams> params = LossyChunkParams::DecodeFrom(base.reader->chunk_params(c));
  return params.ok() ? params->source_digest : 0;
}

}  // namespace

std::vector<std::optional<uint64_t>> MatchBaseTensors(const Layout& layout, const BlobReader& base) {
  std::vector<std::optional<uint64_t>> matches(layout.tensors.size());
  auto single_segment = [](const auto& segments, int32_t tensor) -> const auto* {
    decltype(&segments[0]) found = nullptr;
    for (const auto& s : segments) {
      if (s.tensor != tensor) continue;
      if (found != nullptr) return decltype(found){nullptr};
      found = &s;
    }
    return found;
  };
  // By name first (a checkpoint may hold tens of thousands of tensors).
  std::unordered_map<std::string_view, std::vector<size_t>> by_name;
  for (size_t b = 0; b < base.tensors().size(); ++b) by_name[base.tensors()[b].name].push_back(b);
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorInfo& mine = layout.tensors[t];
    const auto named = by_name.find(mine.name);
    if (named == by_name.end()) continue;
    const auto* my_segment = single_segment(layout.segments, static_cast<int32_t>(t));
    if (my_segment == nullptr) continue;
    for (size_t b : named->second) {
      const TensorInfo& theirs = base.tensors()[b];
      if (theirs.dtype != mine.dtype || theirs.shape != mine.shape || theirs.big_endian != mine.big_endian) continue;
      const auto* base_segment = single_segment(base.segments(), static_cast<int32_t>(b));
      if (base_segment != nullptr && base_segment->length == my_segment->length) matches[t] = base_segment->offset;
      break;
    }
  }
  return matches;
}

std::vector<std::optional<uint64_t>> StepSpaceSources(const Layout& layout, const StepStates& states,
                                                      const std::vector<PlannedChunk>& plan) {
  std::vector<int32_t> second_moment(layout.tensors.size(), -1);
  for (const StepStateTensors& s : states.states)
    if (s.m >= 0 && s.v >= 0) second_moment[s.m] = s.v;
  std::vector<std::optional<uint64_t>> out(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedChunk& c = plan[i];
    // An absolute bound is one on m, which the step's scale would not keep.
    if (c.tensor < 0 || !c.lossy() || !(c.budget.rel_l2 > 0) || c.budget.max_abs > 0 || c.dtype != DType::kF32)
      continue;
    const int32_t v = second_moment[c.tensor];
    if (v < 0 || layout.tensors[v].dtype != DType::kF32) continue;
    const std::optional<uint64_t>& m_at = states.tensor_offset[c.tensor];
    const std::optional<uint64_t>& v_at = states.tensor_offset[v];
    if (!m_at || !v_at || c.offset < *m_at || states.tensor_elements[v] != states.tensor_elements[c.tensor] ||
        states.tensor_elements[c.tensor] < kMinStepSpaceElements)
      continue;
    out[i] = *v_at + (c.offset - *m_at);
  }
  return out;
}

ByteSpan ReadBaseBytes(const PlannedChunk& plan, const BaseRef* base, CodecScratch& scratch) {
  if (!plan.base_offset) return {};
  // A base that cannot be read (damaged, or its own base is gone) must not
  // stop the new version from being stored: the chunk becomes a key frame.
  std::byte* buffer = scratch.base.ReserveForFallback(plan.length);
  Result<ByteSpan> bytes = base->reader->ViewAt(*plan.base_offset, MutableByteSpan(buffer, plan.length),
                                                &scratch.base_hold);
  if (!bytes.ok()) return {};
  return *bytes;
}

std::vector<StepCandidate> StepCandidates(const Layout& layout, const StepStates& states,
                                          const std::vector<std::optional<uint64_t>>& base_match,
                                          const PlannedChunk& plan) {
  std::vector<StepCandidate> out;
  const int32_t t = plan.tensor;
  if (t < 0 || !states.tensor_offset[t]) return out;
  const uint64_t elem = DTypeSize(plan.dtype);
  const uint64_t first = (plan.offset - *states.tensor_offset[t]) / elem;
  const uint64_t count = states.tensor_elements[t];
  for (const StepStateTensors& s : states.states) {
    if (states.tensor_elements[s.m] != count) continue;
    const DType state_dtype = layout.tensors[s.m].dtype;
    const uint64_t skip = first * DTypeSize(state_dtype);
    StepCandidate c;
    c.state_type = *lossy::ElementTypeOf(state_dtype);
    c.m_offset = *states.tensor_offset[s.m] + skip;
    c.has_v = s.v >= 0;
    if (c.has_v) c.v_offset = *states.tensor_offset[s.v] + skip;
    if (!base_match.empty() && base_match[s.m] && (!c.has_v || base_match[s.v])) {
      c.m_base_offset = *base_match[s.m] + skip;
      if (c.has_v) c.v_base_offset = *base_match[s.v] + skip;
    }
    out.push_back(c);
  }
  return out;
}

SourceMatch MatchSource(const PlannedChunk& plan, const BaseRef* base, ByteSpan data, ByteSpan base_bytes) {
  SourceMatch m;
  m.digest = Checksum64(data);
  m.unchanged = !base_bytes.empty() && m.digest != 0 && BaseSourceDigest(plan, *base) == m.digest;
  return m;
}

}  // namespace ckptfs

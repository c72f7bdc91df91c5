// Some frameworks save the same weights in two files of one checkpoint:
// DeepSpeed's ZeRO writes the module's fp32 weights into
// mp_rank_00_model_states.pt and each rank's flat fp32 partition of them
// into zero_pp_rank_R_..._optim_states.pt. Coded apart, those weights are
// paid for twice. Coded as a *ref copy* (FORMAT.md "Step prediction", inputs
// bit `ref`), a chunk of the second file is a delta frame against the first
// file's reconstruction of the same values, read from that file's blob
// (the blob's ref, FORMAT.md "Index header"): it costs what that
// reconstruction leaves outside the chunk's budget, next to nothing.
//
// The second file names nothing of the first (a flat partition is the
// concatenation of slices of several tensors), so the values are found by
// evidence: when a file is encoded, a sample of its f32 values (those whose
// bits hash below a threshold: the same values are picked in any file that
// holds them, wherever they are) is kept with their offsets; a later file's
// chunk whose sampled values are found at one shift, inside one tensor of
// the earlier file, is coded against that range. A wrong match only costs
// bytes: the chunk's error is measured against its own values.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/simd_level.h"
#include "codec/container/blob.h"
#include "codec/container/chunk_plan.h"
#include "codec/format/layout.h"

namespace ckptfs {

// One element in kValueSampleRate is sampled (by its bits); at most about
// kMaxValueSamples per file (16 bytes each in memory): a larger file is
// sampled more sparsely, one in a larger power of two, throughout.
inline constexpr uint32_t kValueSampleShift = 11;
inline constexpr uint32_t kValueSampleRate = 1u << kValueSampleShift;
inline constexpr size_t kMaxValueSamples = size_t{1} << 18;
// A run needs at least this many sampled values found at one shift.
inline constexpr uint32_t kRefMinVotes = 3;

struct ValueSample {
  // (f32 bits, logical offset in the file), sorted by bits; a value found
  // twice is dropped (it says nothing about where a range lies).
  std::vector<std::pair<uint32_t, uint64_t>> entries;
  // [start, end) of each sampled tensor's bytes, sorted.
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  uint64_t memory_bytes() const { return entries.capacity() * 16 + extents.capacity() * 16; }
};

// The sample of `file`'s little-endian f32 tensors stored as one segment
// of at least kValueSampleRate elements, other than an optimizer's state
// (its values are never another file's weights).
ValueSample SampleValues(const Layout& layout, ByteSpan file);

// Whether an f32 value with these bits is sampled at one in 2^shift
// (zeros never are). The samples at a larger shift are a subset of those
// at a smaller one: a file sampled at the base rate finds the values of one
// sampled more sparsely.
inline bool IsSampledValue(uint32_t bits, uint32_t shift = kValueSampleShift) {
  return (bits & 0x7fffffffu) != 0 && ((bits * 0x9E3779B1u) >> (32 - shift)) == 0;
}

// Bit j set where the f32 at p + 4 j (j < 32) IsSampledValue at `shift`
// (1..31): by AVX2 where the CPU has it and max_simd allows, the same bits
// as the scalar test. A commit scans every weight of a file this way
// before its encode starts (SampleValues), so the scan is on the commit's
// serial head: 0.14-0.21 s per 600 MB checkpoint one element at a time.
uint32_t SampledMask32(const std::byte* p, uint32_t shift, SimdLevel max_simd = SimdLevel::kAvx512);

// on_hit(i, bits) for each i < n, in order, whose f32 `bits` at data + 4 i
// IsSampledValue at `shift`; stops when on_hit returns false.
template <typename F>
void ScanSampledValues(const std::byte* data, uint64_t n, uint32_t shift, F&& on_hit,
                       SimdLevel max_simd = SimdLevel::kAvx512) {
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (uint32_t mask = SampledMask32(data + 4 * i, shift, max_simd); mask != 0; mask &= mask - 1) {
      const uint64_t at = i + static_cast<uint64_t>(__builtin_ctz(mask));
      uint32_t bits;
      std::memcpy(&bits, data + 4 * at, 4);
      if (!on_hit(at, bits)) return;
    }
  }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + 4 * i, 4);
    if (IsSampledValue(bits, shift) && !on_hit(i, bits)) return;
  }
}

// An earlier file's blob and the sample of the values it was made from.
struct RefCandidate {
  ObjectId id;
  std::shared_ptr<const BlobReader> reader;
  std::shared_ptr<const ValueSample> values;
};

// A range of this file whose values lie in the ref at ref_offset (logical
// offsets, bytes).
struct RefRun {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t ref_offset = 0;
};

struct RefRuns {
  int32_t candidate = -1;    // the chosen candidate, -1: none
  std::vector<RefRun> runs;  // disjoint; sorted by offset within each tensor
};

// The candidate holding the most of the eligible tensors' values
// (`eligible[t]`: little-endian f32 tensors stored as one segment), and
// the runs of this file it holds: a run is a stretch of one tensor whose
// sampled values are found at one shift (at least kRefMinVotes of them),
// extended to the ends of the candidate's tensor they fall in (a flat
// partition concatenates whole tensors: a run ends where one of them
// does), within this tensor and up to the neighbouring runs. The encoder
// cuts chunks at the runs' ends.
RefRuns FindRefRuns(const Layout& layout, ByteSpan file, const std::vector<bool>& eligible,
                    const std::vector<RefCandidate>& candidates);

}  // namespace ckptfs

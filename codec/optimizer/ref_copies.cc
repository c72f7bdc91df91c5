#include "codec/optimizer/ref_copies.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/optimizer/step_sources.h"

namespace ckptfs {
namespace {

uint32_t BitsAt(const std::byte* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return bits;
}

// Where `bits` lies in `sample`, if it was sampled there once.
std::optional<uint64_t> Find(const ValueSample& sample, uint32_t bits) {
  auto it = std::lower_bound(sample.entries.begin(), sample.entries.end(), bits,
                             [](const std::pair<uint32_t, uint64_t>& e, uint32_t b) { return e.first < b; });
  if (it == sample.entries.end() || it->first != bits) return std::nullopt;
  return it->second;
}

// The sampled tensor holding logical offset `at` of the sample's file.
const std::pair<uint64_t, uint64_t>* ExtentAt(const ValueSample& sample, uint64_t at) {
  auto it = std::upper_bound(sample.extents.begin(), sample.extents.end(), at,
                             [](uint64_t a, const std::pair<uint64_t, uint64_t>& e) { return a < e.first; });
  if (it == sample.extents.begin()) return nullptr;
  --it;
  return at < it->second ? &*it : nullptr;
}

// A sampled value of this file: its logical offset and bits.
struct Sampled {
  uint64_t offset;
  uint32_t bits;
};

// The runs of one tensor (its bytes [start, end), sampled values `values`
// in order) that `sample` holds.
void TensorRuns(const ValueSample& sample, uint64_t start, uint64_t end, const std::vector<Sampled>& values,
                std::vector<RefRun>* runs) {
  size_t i = 0;
  while (i < values.size()) {
    const std::optional<uint64_t> at = Find(sample, values[i].bits);
    if (!at) {
      ++i;
      continue;
    }
    // The hits that follow at the same shift.
    const int64_t shift = static_cast<int64_t>(*at) - static_cast<int64_t>(values[i].offset);
    uint64_t last_ref = *at;
    uint32_t votes = 1;
    size_t j = i + 1;
    for (; j < values.size(); ++j) {
      const std::optional<uint64_t> next = Find(sample, values[j].bits);
      if (!next) continue;
      if (static_cast<int64_t>(*next) - static_cast<int64_t>(values[j].offset) != shift) break;
      last_ref = *next;
      ++votes;
    }
    const auto* first_extent = ExtentAt(sample, *at);
    const auto* last_extent = ExtentAt(sample, last_ref);
    i = j;
    if (votes < kRefMinVotes || first_extent == nullptr || last_extent == nullptr) continue;
    // Out to the ends of the candidate's tensors the hits fall in, within this tensor.
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(start), static_cast<int64_t>(first_extent->first) - shift);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(end), static_cast<int64_t>(last_extent->second) - shift);
    if (lo >= hi) continue;
    runs->push_back(RefRun{static_cast<uint64_t>(lo), static_cast<uint64_t>(hi - lo), static_cast<uint64_t>(lo + shift)});
  }
}

// Per tensor of `layout`: the bytes of its (last) segment; with
// SingleSegmentOffsets, a single-segment tensor's extent.
std::vector<uint64_t> SegmentLengths(const Layout& layout) {
  std::vector<uint64_t> lengths(layout.tensors.size(), 0);
  for (const Segment& s : layout.segments)
    if (s.tensor >= 0) lengths[s.tensor] = s.length;
  return lengths;
}

#if defined(__x86_64__)
// Four vectors of eight: each lane's bits * 0x9E3779B1 shifted right by
// 32 - shift is zero, and its magnitude is not.
__attribute__((target("avx2"))) uint32_t SampledMask32Avx2(const std::byte* p, uint32_t shift) {
  const __m256i golden = _mm256_set1_epi32(static_cast<int32_t>(0x9E3779B1u));
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m128i count = _mm_cvtsi32_si128(static_cast<int>(32 - shift));
  const __m256i zero = _mm256_setzero_si256();
  uint32_t mask = 0;
  for (int v = 0; v < 4; ++v) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * v));
    const __m256i hashed = _mm256_srl_epi32(_mm256_mullo_epi32(bits, golden), count);
    const __m256i sampled = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(bits, magnitude), zero),
                                                _mm256_cmpeq_epi32(hashed, zero));
    mask |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(sampled))) << (8 * v);
  }
  return mask;
}
#endif

}  // namespace

uint32_t SampledMask32(const std::byte* p, uint32_t shift, SimdLevel max_simd) {
#if defined(__x86_64__)
  if (max_simd >= SimdLevel::kAvx2 && BestSimdLevel() >= SimdLevel::kAvx2) return SampledMask32Avx2(p, shift);
#endif
  uint32_t mask = 0;
  for (uint32_t j = 0; j < 32; ++j) mask |= static_cast<uint32_t>(IsSampledValue(BitsAt(p + 4 * j), shift)) << j;
  return mask;
}

ValueSample SampleValues(const Layout& layout, ByteSpan file) {
  ValueSample sample;
  const std::vector<std::optional<uint64_t>> offsets = SingleSegmentOffsets(layout);
  const std::vector<bool> is_state = FindStepStates(layout).is_state;
  const std::vector<uint64_t> lengths = SegmentLengths(layout);
  std::vector<size_t> sampled;
  uint64_t elements = 0;
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorInfo& tensor = layout.tensors[t];
    const uint64_t n = lengths[t] / 4;
    if (tensor.dtype != DType::kF32 || tensor.big_endian || !offsets[t] || (!is_state.empty() && is_state[t]) ||
        n < kValueSampleRate || *offsets[t] + n * 4 > file.size())
      continue;
    sampled.push_back(t);
    elements += n;
  }
  uint32_t shift = kValueSampleShift;
  while (shift < 31 && (elements >> shift) > kMaxValueSamples) ++shift;
  for (size_t t : sampled) {
    const uint64_t n = lengths[t] / 4;
    const std::byte* data = file.data() + *offsets[t];
    ScanSampledValues(data, n, shift, [&](uint64_t i, uint32_t bits) {
      if (sample.entries.size() >= 2 * kMaxValueSamples) return false;
      sample.entries.emplace_back(bits, *offsets[t] + i * 4);
      return true;
    });
    sample.extents.emplace_back(*offsets[t], *offsets[t] + n * 4);
  }
  std::sort(sample.entries.begin(), sample.entries.end());
  // Drop every value seen more than once.
  size_t kept = 0;
  for (size_t i = 0; i < sample.entries.size();) {
    size_t j = i + 1;
    while (j < sample.entries.size() && sample.entries[j].first == sample.entries[i].first) ++j;
    if (j == i + 1) sample.entries[kept++] = sample.entries[i];
    i = j;
  }
  sample.entries.resize(kept);
  sample.entries.shrink_to_fit();
  std::sort(sample.extents.begin(), sample.extents.end());
  return sample;
}

RefRuns FindRefRuns(const Layout& layout, ByteSpan file, const std::vector<bool>& eligible,
                    const std::vector<RefCandidate>& candidates) {
  RefRuns best;
  if (candidates.empty()) return best;
  // This file's sampled values, per eligible tensor (the same for every candidate).
  const std::vector<std::optional<uint64_t>> offsets = SingleSegmentOffsets(layout);
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // of the tensors scanned
  std::vector<std::vector<Sampled>> values;
  const std::vector<uint64_t> lengths = SegmentLengths(layout);
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorInfo& tensor = layout.tensors[t];
    if (!eligible[t] || tensor.dtype != DType::kF32 || tensor.big_endian || !offsets[t]) continue;
    const uint64_t n = lengths[t] / 4;
    if (n == 0 || *offsets[t] + n * 4 > file.size()) continue;
    extents.emplace_back(*offsets[t], *offsets[t] + n * 4);
    values.emplace_back();
    const std::byte* data = file.data() + *offsets[t];
    ScanSampledValues(data, n, kValueSampleShift, [&](uint64_t e, uint32_t bits) {
      values.back().push_back(Sampled{*offsets[t] + e * 4, bits});
      return true;
    });
  }
  uint64_t best_bytes = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const ValueSample* sample = candidates[k].values.get();
    if (sample == nullptr || sample->entries.empty()) continue;
    std::vector<RefRun> runs;
    for (size_t t = 0; t < extents.size(); ++t) {
      const size_t first = runs.size();
      TensorRuns(*sample, extents[t].first, extents[t].second, values[t], &runs);
      // Disjoint within the tensor: a run starts where the one before ends.
      std::sort(runs.begin() + static_cast<ptrdiff_t>(first), runs.end(),
                [](const RefRun& a, const RefRun& b) { return a.offset < b.offset; });
      std::vector<RefRun> kept(runs.begin(), runs.begin() + static_cast<ptrdiff_t>(first));
      for (size_t r = first; r < runs.size(); ++r) {
        RefRun run = runs[r];
        if (kept.size() > first) {
          const uint64_t end = kept.back().offset + kept.back().length;
          if (end >= run.offset + run.length) continue;
          if (end > run.offset) {
            run.ref_offset += end - run.offset;
            run.length -= end - run.offset;
            run.offset = end;
          }
        }
        kept.push_back(run);
      }
      runs = std::move(kept);
    }
    uint64_t bytes = 0;
    for (const RefRun& r : runs) bytes += r.length;
    if (bytes > best_bytes) {
      best_bytes = bytes;
      best.candidate = static_cast<int32_t>(k);
      best.runs = std::move(runs);
    }
  }
  return best;
}

}  // namespace ckptfs

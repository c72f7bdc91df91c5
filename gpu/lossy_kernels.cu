// CUDA kernels of the lossy codec. See gpu/lossy_kernels.h for the contract
// and codec/tensor/lossy/kernels_cpu.cc for the reference they reproduce.
#include "gpu/lossy_kernels.h"

namespace ckptfs::gpu {

using lossy::ElementType;
using lossy::QuantizeTable;

namespace {

constexpr uint32_t kThreads = 256;
constexpr uint32_t kWarp = 32;
constexpr uint32_t kFullMask = 0xffffffffu;
// Elements per tile of the exact-element compaction (one thread each).
constexpr uint32_t kCompactTile = kThreads;
constexpr uint32_t kScanThreads = 1024;

uint32_t Blocks(uint64_t work, uint32_t per_block) { return static_cast<uint32_t>((work + per_block - 1) / per_block); }

// The fixed lane fold of element_ops.h: lane l += lane l + s for s = 16..1.
__device__ double WarpFold(double v) {
  for (uint32_t s = kWarp / 2; s != 0; s >>= 1) v = v + __shfl_down_sync(kFullMask, v, s);
  return v;
}

// Loads a QuantizeTable into shared memory word by word (the struct has
// default member initialisers, so it cannot be a __shared__ object itself).
__device__ const QuantizeTable* LoadTable(const QuantizeTable* d_table, uint32_t* words) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(d_table);
  for (uint32_t w = threadIdx.x; w < sizeof(QuantizeTable) / 4; w += blockDim.x) words[w] = src[w];
  __syncthreads();
  return reinterpret_cast<const QuantizeTable*>(words);
}

// One warp per reduction block of kReduceBlock elements.
template <typename E>
__global__ void ResidualKernel(const typename E::Bits* d_values, const typename E::Bits* d_base, uint64_t n,
                               float* d_residual, double* d_partials) {
  uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  uint32_t lane = threadIdx.x % kWarp;
  uint64_t start = warp * lossy::kReduceBlock;
  if (start >= n) return;  // the whole warp leaves together
  uint64_t end = min(n, start + lossy::kReduceBlock);
  double acc = 0.0;
  for (uint64_t i = start + lane; i < end; i += kWarp) {
    float x = E::ToFloat(d_values[i]);
    d_residual[i] = d_base ? x - E::ToFloat(d_base[i]) : x;
    acc = acc + lossy::FiniteSquare(x);
  }
  acc = WarpFold(acc);
  if (lane == 0) d_partials[warp] = acc;
}

__global__ void HistogramKernel(const float* d_residual, uint64_t n, uint32_t* d_counts) {
  extern __shared__ uint32_t local[];
  for (uint32_t b = threadIdx.x; b < lossy::kHistogramBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    atomicAdd(&local[__float_as_uint(d_residual[i]) >> lossy::kHistogramShift], 1u);
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < lossy::kHistogramBins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&d_counts[b], local[b]);
}

// One thread per group of kPackGroup elements.
template <typename E>
__global__ void QuantizePackKernel(const QuantizeTable* d_table, const typename E::Bits* d_values,
                                   const typename E::Bits* d_base, const float* d_residual, uint64_t n,
                                   uint8_t* d_packed, typename E::Bits* d_recon, unsigned long long* d_counters) {
  __shared__ uint32_t table_words[sizeof(QuantizeTable) / 4];
  const QuantizeTable& t = *LoadTable(d_table, table_words);
  uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint64_t groups = (n + lossy::kPackGroup - 1) / lossy::kPackGroup;
  uint32_t count[3] = {0, 0, 0};
  if (g < groups) {
    uint64_t word = 0;
    for (uint32_t j = 0; j < lossy::kPackGroup; ++j) {
      uint64_t i = g * lossy::kPackGroup + j;
      if (i >= n) break;
      typename E::Bits x = d_values[i];
      typename E::Bits b = d_base ? d_base[i] : typename E::Bits{0};
      lossy::ElementResult<E> res = lossy::QuantizeElement<E>(t, x, b, d_base != nullptr, d_residual[i]);
      d_recon[i] = res.recon;
      word |= static_cast<uint64_t>(res.symbol) << (j * t.bits);
      ++count[res.cls];
    }
    for (uint32_t k = 0; k < t.bits; ++k) d_packed[g * t.bits + k] = static_cast<uint8_t>(word >> (8 * k));
  }
  for (int c = 0; c < 3; ++c) {
    uint32_t sum = __reduce_add_sync(kFullMask, count[c]);
    if (threadIdx.x % kWarp == 0 && sum != 0) atomicAdd(&d_counters[c], static_cast<unsigned long long>(sum));
  }
}

template <typename E>
__global__ void ErrorPartialsKernel(const typename E::Bits* d_values, const typename E::Bits* d_recon, uint64_t n,
                                    double* d_partials, unsigned long long* d_counters) {
  uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  uint32_t lane = threadIdx.x % kWarp;
  uint64_t start = warp * lossy::kReduceBlock;
  if (start >= n) return;
  uint64_t end = min(n, start + lossy::kReduceBlock);
  double acc = 0.0, max_err = 0.0;
  for (uint64_t i = start + lane; i < end; i += kWarp) {
    double abs_err;
    acc = acc + lossy::SquaredError<E>(d_values[i], d_recon[i], &abs_err);
    max_err = fmax(max_err, abs_err);
  }
  acc = WarpFold(acc);
  for (uint32_t s = kWarp / 2; s != 0; s >>= 1) max_err = fmax(max_err, __shfl_down_sync(kFullMask, max_err, s));
  if (lane == 0) {
    d_partials[warp] = acc;
    atomicMax(&d_counters[kCounterMaxError], static_cast<unsigned long long>(lossy::DoubleBits(max_err)));
  }
}

__device__ bool IsExact(const QuantizeTable* d_table, const float* d_residual, uint64_t i) {
  return (__float_as_uint(d_residual[i]) & 0x7fffffffu) >= d_table->exact_from;
}

// Pass 1: exact elements per tile.
__global__ void CountExactKernel(const QuantizeTable* d_table, const float* d_residual, uint64_t n,
                                 uint32_t* d_tile_counts) {
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * kCompactTile + threadIdx.x;
  int flag = i < n && IsExact(d_table, d_residual, i);
  int count = __syncthreads_count(flag);
  if (threadIdx.x == 0) d_tile_counts[blockIdx.x] = static_cast<uint32_t>(count);
}

// Pass 2: exclusive scan of the tile counts (one block; integers).
__global__ void ScanTilesKernel(const uint32_t* d_tile_counts, uint32_t tiles, uint32_t* d_tile_offsets,
                                unsigned long long* d_count) {
  __shared__ uint32_t sums[kScanThreads];
  uint32_t per = (tiles + kScanThreads - 1) / kScanThreads;
  uint32_t first = threadIdx.x * per;
  uint32_t last = min(tiles, first + per);
  uint32_t local = 0;
  for (uint32_t t = first; t < last; ++t) local += d_tile_counts[t];
  sums[threadIdx.x] = local;
  __syncthreads();
  for (uint32_t s = 1; s < kScanThreads; s <<= 1) {  // inclusive Hillis-Steele scan
    uint32_t add = threadIdx.x >= s ? sums[threadIdx.x - s] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  uint32_t offset = sums[threadIdx.x] - local;
  for (uint32_t t = first; t < last; ++t) {
    d_tile_offsets[t] = offset;
    offset += d_tile_counts[t];
  }
  if (threadIdx.x == kScanThreads - 1) *d_count = sums[kScanThreads - 1];
}

// Pass 3: each tile writes its exact elements in order.
template <typename E>
__global__ void ScatterExactKernel(const QuantizeTable* d_table, const typename E::Bits* d_values,
                                   const float* d_residual, uint64_t n, const uint32_t* d_tile_offsets,
                                   uint32_t* d_positions, typename E::Bits* d_raw) {
  __shared__ uint32_t warp_counts[kThreads / kWarp];
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * kCompactTile + threadIdx.x;
  bool flag = i < n && IsExact(d_table, d_residual, i);
  uint32_t lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  uint32_t ballot = __ballot_sync(kFullMask, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  uint32_t before = 0;
  for (uint32_t w = 0; w < warp; ++w) before += warp_counts[w];
  before += __popc(ballot & ((1u << lane) - 1u));
  if (flag) {
    uint32_t k = d_tile_offsets[blockIdx.x] + before;
    d_positions[k] = static_cast<uint32_t>(i);
    d_raw[k] = d_values[i];
  }
}

template <typename E>
__global__ void DequantizeKernel(uint32_t bits, const float* d_levels, const uint8_t* d_packed,
                                 const typename E::Bits* d_base, uint64_t n, typename E::Bits* d_out,
                                 unsigned int* d_max_symbol) {
  __shared__ float levels[lossy::kMaxLevels];
  for (uint32_t j = threadIdx.x; j < lossy::kMaxLevels; j += blockDim.x) levels[j] = d_levels[j];
  __syncthreads();
  uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint64_t groups = (n + lossy::kPackGroup - 1) / lossy::kPackGroup;
  uint32_t max_sym = 0;
  if (g < groups) {
    uint64_t word = 0;
    for (uint32_t k = 0; k < bits; ++k) word |= static_cast<uint64_t>(d_packed[g * bits + k]) << (8 * k);
    uint64_t mask = (1ull << bits) - 1;
    for (uint32_t j = 0; j < lossy::kPackGroup; ++j) {
      uint64_t i = g * lossy::kPackGroup + j;
      if (i >= n) break;
      uint32_t sym = static_cast<uint32_t>((word >> (j * bits)) & mask);
      max_sym = max(max_sym, sym);
      typename E::Bits b = d_base ? d_base[i] : typename E::Bits{0};
      d_out[i] = lossy::DequantizeElement<E>(levels, sym, b, d_base != nullptr);
    }
  }
  uint32_t warp_max = __reduce_max_sync(kFullMask, max_sym);
  if (threadIdx.x % kWarp == 0 && warp_max != 0) atomicMax(d_max_symbol, warp_max);
}

template <typename F>
cudaError_t WithElement(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kF32: return f.template operator()<lossy::F32Elem>();
    case ElementType::kF16: return f.template operator()<lossy::F16Elem>();
    case ElementType::kBF16: return f.template operator()<lossy::BF16Elem>();
  }
  return cudaErrorInvalidValue;
}

template <typename E>
const typename E::Bits* As(const void* p) {
  return static_cast<const typename E::Bits*>(p);
}
template <typename E>
typename E::Bits* As(void* p) {
  return static_cast<typename E::Bits*>(p);
}

}  // namespace

cudaError_t LaunchResidual(ElementType type, const void* d_values, const void* d_base, uint64_t n, float* d_residual,
                           double* d_norm_partials, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  uint32_t blocks = Blocks(lossy::ReduceBlocks(n) * kWarp, kThreads);
  return WithElement(type, [&]<typename E>() {
    ResidualKernel<E><<<blocks, kThreads, 0, stream>>>(As<E>(d_values), As<E>(d_base), n, d_residual, d_norm_partials);
    return cudaGetLastError();
  });
}

cudaError_t LaunchHistogram(const float* d_residual, uint64_t n, uint32_t* d_counts, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(d_counts, 0, lossy::kHistogramBins * sizeof(uint32_t), stream);
  if (err != cudaSuccess || n == 0) return err;
  constexpr int kSharedBytes = lossy::kHistogramBins * sizeof(uint32_t);
  err = cudaFuncSetAttribute(HistogramKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
  uint32_t blocks = min(Blocks(n, kThreads * 16), static_cast<uint32_t>(2 * sms));
  HistogramKernel<<<blocks, kThreads * 4, kSharedBytes, stream>>>(d_residual, n, d_counts);
  return cudaGetLastError();
}

cudaError_t LaunchQuantizePack(ElementType type, const QuantizeTable* d_table, const void* d_values, const void* d_base,
                               const float* d_residual, uint64_t n, uint8_t* d_packed, void* d_recon,
                               unsigned long long* d_counters, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  uint32_t blocks = Blocks((n + lossy::kPackGroup - 1) / lossy::kPackGroup, kThreads);
  return WithElement(type, [&]<typename E>() {
    QuantizePackKernel<E><<<blocks, kThreads, 0, stream>>>(d_table, As<E>(d_values), As<E>(d_base), d_residual, n,
                                                           d_packed, As<E>(d_recon), d_counters);
    return cudaGetLastError();
  });
}

cudaError_t LaunchErrorPartials(ElementType type, const void* d_values, const void* d_recon, uint64_t n,
                                double* d_error_partials, unsigned long long* d_counters, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  uint32_t blocks = Blocks(lossy::ReduceBlocks(n) * kWarp, kThreads);
  return WithElement(type, [&]<typename E>() {
    ErrorPartialsKernel<E>
        <<<blocks, kThreads, 0, stream>>>(As<E>(d_values), As<E>(d_recon), n, d_error_partials, d_counters);
    return cudaGetLastError();
  });
}

size_t CompactExactScratchBytes(uint64_t n) {
  uint64_t tiles = Blocks(n, kCompactTile);
  return 2 * tiles * sizeof(uint32_t);
}

cudaError_t LaunchCompactExact(ElementType type, const QuantizeTable* d_table, const void* d_values,
                               const float* d_residual, uint64_t n, void* d_scratch, size_t scratch_bytes,
                               uint32_t* d_positions, void* d_raw, unsigned long long* d_count, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(d_count, 0, sizeof(unsigned long long), stream);
  if (err != cudaSuccess || n == 0) return err;
  if (scratch_bytes < CompactExactScratchBytes(n)) return cudaErrorInvalidValue;
  uint32_t tiles = Blocks(n, kCompactTile);
  uint32_t* d_tile_counts = static_cast<uint32_t*>(d_scratch);
  uint32_t* d_tile_offsets = d_tile_counts + tiles;
  CountExactKernel<<<tiles, kCompactTile, 0, stream>>>(d_table, d_residual, n, d_tile_counts);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  ScanTilesKernel<<<1, kScanThreads, 0, stream>>>(d_tile_counts, tiles, d_tile_offsets, d_count);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return WithElement(type, [&]<typename E>() {
    ScatterExactKernel<E><<<tiles, kCompactTile, 0, stream>>>(d_table, As<E>(d_values), d_residual, n, d_tile_offsets,
                                                              d_positions, As<E>(d_raw));
    return cudaGetLastError();
  });
}

cudaError_t LaunchDequantize(ElementType type, uint32_t bits, const float* d_levels, const uint8_t* d_packed,
                             const void* d_base, uint64_t n, void* d_out, unsigned int* d_max_symbol,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bits < 1 || bits > 8) return cudaErrorInvalidValue;
  uint32_t blocks = Blocks((n + lossy::kPackGroup - 1) / lossy::kPackGroup, kThreads);
  return WithElement(type, [&]<typename E>() {
    DequantizeKernel<E>
        <<<blocks, kThreads, 0, stream>>>(bits, d_levels, d_packed, As<E>(d_base), n, As<E>(d_out), d_max_symbol);
    return cudaGetLastError();
  });
}

}  // namespace ckptfs::gpu

// Kernel timing for scripts/gpu-check.sh (see BenchmarkLossyKernels).
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/lossy_backend.h"
#include "gpu/lossy_kernels.h"

namespace ckptfs::gpu {
namespace {

Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("cuda: ") + what + ": " + cudaGetErrorString(err));
}

// Frees every pointer it was given, on every path.
struct Allocations {
  std::vector<void*> ptrs;
  ~Allocations() {
    for (void* p : ptrs) cudaFree(p);
  }
  Status Alloc(void** p, size_t bytes) {
    RETURN_IF_ERROR(Check(cudaMalloc(p, bytes == 0 ? 1 : bytes), "cudaMalloc"));
    ptrs.push_back(*p);
    return Status::Ok();
  }
};

}  // namespace

Result<std::string> BenchmarkLossyKernels(lossy::ElementType type, ByteSpan values, ByteSpan base,
                                          const lossy::QuantizeTable& table, int reps) {
  DeviceInfo device = ProbeDevice();
  if (!device.present) return Status::Unsupported("lossy kernel benchmark: " + device.why_absent);
  const size_t width = lossy::ElementSize(type);
  const uint64_t n = values.size() / width;
  Allocations a;
  void *d_values, *d_base = nullptr, *d_residual, *d_partials, *d_hist, *d_table, *d_packed, *d_recon, *d_counters,
                  *d_positions, *d_raw, *d_scratch, *d_levels, *d_out;
  RETURN_IF_ERROR(a.Alloc(&d_values, values.size()));
  if (!base.empty()) RETURN_IF_ERROR(a.Alloc(&d_base, base.size()));
  RETURN_IF_ERROR(a.Alloc(&d_residual, n * sizeof(float)));
  RETURN_IF_ERROR(a.Alloc(&d_partials, lossy::ReduceBlocks(n) * sizeof(double)));
  RETURN_IF_ERROR(a.Alloc(&d_hist, lossy::kHistogramBins * sizeof(uint32_t)));
  RETURN_IF_ERROR(a.Alloc(&d_table, sizeof(lossy::QuantizeTable)));
  RETURN_IF_ERROR(a.Alloc(&d_packed, lossy::PackedBytes(n, table.bits)));
  RETURN_IF_ERROR(a.Alloc(&d_recon, values.size()));
  RETURN_IF_ERROR(a.Alloc(&d_counters, kLossyCounters * sizeof(unsigned long long)));
  RETURN_IF_ERROR(a.Alloc(&d_positions, n * sizeof(uint32_t)));
  RETURN_IF_ERROR(a.Alloc(&d_raw, values.size()));
  const size_t scratch = CompactExactScratchBytes(n);
  RETURN_IF_ERROR(a.Alloc(&d_scratch, scratch));
  RETURN_IF_ERROR(a.Alloc(&d_levels, lossy::kMaxLevels * sizeof(float)));
  RETURN_IF_ERROR(a.Alloc(&d_out, values.size()));
  RETURN_IF_ERROR(Check(cudaMemcpy(d_values, values.data(), values.size(), cudaMemcpyHostToDevice), "upload"));
  if (d_base) RETURN_IF_ERROR(Check(cudaMemcpy(d_base, base.data(), base.size(), cudaMemcpyHostToDevice), "upload"));
  RETURN_IF_ERROR(Check(cudaMemcpy(d_table, &table, sizeof table, cudaMemcpyHostToDevice), "upload"));
  RETURN_IF_ERROR(Check(cudaMemcpy(d_levels, table.levels, sizeof table.levels, cudaMemcpyHostToDevice), "upload"));
  cudaStream_t stream;
  RETURN_IF_ERROR(Check(cudaStreamCreate(&stream), "cudaStreamCreate"));
  cudaEvent_t start, stop;
  RETURN_IF_ERROR(Check(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(Check(cudaEventCreate(&stop), "cudaEventCreate"));

  const auto* tbl = static_cast<const lossy::QuantizeTable*>(d_table);
  auto* counters = static_cast<unsigned long long*>(d_counters);
  struct Kernel {
    const char* name;
    std::function<cudaError_t()> launch;
  };
  std::vector<Kernel> kernels = {
      {"residual",
       [&] {
         return LaunchResidual(type, d_values, d_base, n, static_cast<float*>(d_residual),
                               static_cast<double*>(d_partials), stream);
       }},
      {"histogram",
       [&] { return LaunchHistogram(static_cast<float*>(d_residual), n, static_cast<uint32_t*>(d_hist), stream); }},
      {"quantize_pack",
       [&] {
         return LaunchQuantizePack(type, tbl, d_values, d_base, static_cast<float*>(d_residual), n,
                                   static_cast<uint8_t*>(d_packed), d_recon, counters, stream);
       }},
      {"error_partials",
       [&] {
         return LaunchErrorPartials(type, d_values, d_recon, n, static_cast<double*>(d_partials), counters, stream);
       }},
      {"compact_exact",
       [&] {
         return LaunchCompactExact(type, tbl, d_values, static_cast<float*>(d_residual), n, d_scratch, scratch,
                                   static_cast<uint32_t*>(d_positions), d_raw, counters, stream);
       }},
      {"dequantize",
       [&] {
         return LaunchDequantize(type, table.bits, static_cast<float*>(d_levels), static_cast<uint8_t*>(d_packed),
                                 d_base, n, d_out, reinterpret_cast<unsigned int*>(counters), stream);
       }},
  };
  std::string json = "{";
  double total_ms = 0;
  for (const Kernel& k : kernels) {
    RETURN_IF_ERROR(Check(k.launch(), k.name));  // warm-up
    RETURN_IF_ERROR(Check(cudaEventRecord(start, stream), "cudaEventRecord"));
    for (int r = 0; r < reps; ++r) RETURN_IF_ERROR(Check(k.launch(), k.name));
    RETURN_IF_ERROR(Check(cudaEventRecord(stop, stream), "cudaEventRecord"));
    RETURN_IF_ERROR(Check(cudaEventSynchronize(stop), "cudaEventSynchronize"));
    float ms = 0;
    RETURN_IF_ERROR(Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime"));
    double per = ms / reps;
    total_ms += per;
    json += "\"" + std::string(k.name) + "\": {\"ms\": " + std::to_string(per) +
            ", \"gb_per_s\": " + std::to_string(values.size() / (per * 1e6)) + "}, ";
  }
  json += "\"all_kernels\": {\"ms\": " + std::to_string(total_ms) +
          ", \"gb_per_s\": " + std::to_string(values.size() / (total_ms * 1e6)) + "}, ";
  json += "\"elements\": " + std::to_string(n) + ", \"device\": \"" + device.name + "\"}";
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return json;
}

}  // namespace ckptfs::gpu

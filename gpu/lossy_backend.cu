// The CUDA backend of lossy::LossyKernels: stages host spans into a device
// workspace (allocated up front and grown between calls, never inside a
// kernel launch), runs the kernels of gpu/lossy_kernels.cu on its own stream
// and copies the results back. Every CUDA call is checked.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "gpu/device.h"
#include "gpu/lossy_backend.h"
#include "gpu/lossy_kernels.h"

namespace ckptfs::gpu {
namespace {

using lossy::ElementType;

Status CudaStatus(cudaError_t err, const char* what) {
  return Status::Internal(std::string("cuda: ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                          ")");
}
#define CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                               \
    cudaError_t ckptfs_cuda_err_ = (expr);                                           \
    if (ckptfs_cuda_err_ != cudaSuccess) return CudaStatus(ckptfs_cuda_err_, #expr); \
  } while (0)

// Owns one device allocation (RAII).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Grows to at least `bytes` (contents are not kept).
  Status Reserve(size_t bytes) {
    if (bytes <= size_) return Status::Ok();
    Release();
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, bytes));
    size_ = bytes;
    return Status::Ok();
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void Release() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // error ignored: nothing to do in a destructor
    ptr_ = nullptr;
    size_ = 0;
  }
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class CudaLossyKernels final : public lossy::LossyKernels {
 public:
  explicit CudaLossyKernels(std::string name) : name_(std::move(name)) {}
  ~CudaLossyKernels() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(uint64_t max_elements) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RETURN_IF_ERROR(Reserve(max_elements));
    RETURN_IF_ERROR(d_histogram_.Reserve(lossy::kHistogramBins * sizeof(uint32_t)));
    RETURN_IF_ERROR(d_table_.Reserve(sizeof(lossy::QuantizeTable)));
    RETURN_IF_ERROR(d_counters_.Reserve(kLossyCounters * sizeof(unsigned long long)));
    RETURN_IF_ERROR(d_levels_.Reserve(lossy::kMaxLevels * sizeof(float)));
    return Status::Ok();
  }

  std::string_view name() const override { return name_; }

  Status Residual(ElementType type, ByteSpan values, ByteSpan base, std::span<float> residual,
                  std::span<double> norm_partials) override {
    const uint64_t n = residual.size();
    RETURN_IF_ERROR(Reserve(n));
    RETURN_IF_ERROR(Upload(d_values_, values));
    RETURN_IF_ERROR(Upload(d_base_, base));
    CUDA_RETURN_IF_ERROR(LaunchResidual(type, d_values_.get(), base.empty() ? nullptr : d_base_.get(), n,
                                        d_residual_.get<float>(), d_partials_.get<double>(), stream_));
    RETURN_IF_ERROR(Download(residual.data(), d_residual_, n * sizeof(float)));
    RETURN_IF_ERROR(Download(norm_partials.data(), d_partials_, norm_partials.size_bytes()));
    return Sync();
  }

  Status Histogram(std::span<const float> residual, std::span<uint32_t> counts) override {
    const uint64_t n = residual.size();
    RETURN_IF_ERROR(Reserve(n));
    RETURN_IF_ERROR(Upload(d_residual_, std::as_bytes(residual)));
    CUDA_RETURN_IF_ERROR(LaunchHistogram(d_residual_.get<float>(), n, d_histogram_.get<uint32_t>(), stream_));
    RETURN_IF_ERROR(Download(counts.data(), d_histogram_, lossy::kHistogramBins * sizeof(uint32_t)));
    return Sync();
  }

  Status QuantizePack(ElementType type, const lossy::QuantizeTable& table, ByteSpan values, ByteSpan base,
                      std::span<const float> residual, MutableByteSpan packed, MutableByteSpan reconstruction,
                      std::span<double> error_partials, double* max_abs_error, lossy::ClassCounts* counts) override {
    const uint64_t n = residual.size();
    RETURN_IF_ERROR(Reserve(n));
    RETURN_IF_ERROR(UploadInputs(table, values, base, residual));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_counters_.get(), 0, kLossyCounters * sizeof(unsigned long long), stream_));
    const void* d_base = base.empty() ? nullptr : d_base_.get();
    auto* d_counters = d_counters_.get<unsigned long long>();
    CUDA_RETURN_IF_ERROR(LaunchQuantizePack(type, d_table_.get<lossy::QuantizeTable>(), d_values_.get(), d_base,
                                            d_residual_.get<float>(), n, d_packed_.get<uint8_t>(), d_recon_.get(),
                                            d_counters, stream_));
    CUDA_RETURN_IF_ERROR(
        LaunchErrorPartials(type, d_values_.get(), d_recon_.get(), n, d_partials_.get<double>(), d_counters, stream_));
    unsigned long long h_counters[kLossyCounters] = {};
    RETURN_IF_ERROR(Download(packed.data(), d_packed_, packed.size()));
    RETURN_IF_ERROR(Download(reconstruction.data(), d_recon_, reconstruction.size()));
    RETURN_IF_ERROR(Download(error_partials.data(), d_partials_, error_partials.size_bytes()));
    RETURN_IF_ERROR(Download(h_counters, d_counters_, sizeof h_counters));
    RETURN_IF_ERROR(Sync());
    counts->pruned = h_counters[kCounterPruned];
    counts->quantized = h_counters[kCounterQuantized];
    counts->exact = h_counters[kCounterExact];
    uint64_t max_bits = h_counters[kCounterMaxError];
    std::memcpy(max_abs_error, &max_bits, sizeof max_bits);
    return Status::Ok();
  }

  Status CompactExact(ElementType type, const lossy::QuantizeTable& table, ByteSpan values,
                      std::span<const float> residual, std::span<uint32_t> positions, MutableByteSpan raw,
                      uint64_t* count) override {
    const uint64_t n = residual.size();
    RETURN_IF_ERROR(Reserve(n));
    RETURN_IF_ERROR(UploadInputs(table, values, {}, residual));
    const size_t scratch = CompactExactScratchBytes(n);
    RETURN_IF_ERROR(d_compact_.Reserve(scratch));
    auto* d_count = d_counters_.get<unsigned long long>();
    CUDA_RETURN_IF_ERROR(LaunchCompactExact(type, d_table_.get<lossy::QuantizeTable>(), d_values_.get(),
                                            d_residual_.get<float>(), n, d_compact_.get(), scratch,
                                            d_positions_.get<uint32_t>(), d_raw_.get(), d_count, stream_));
    unsigned long long h_count = 0;
    RETURN_IF_ERROR(Download(&h_count, d_counters_, sizeof h_count));
    RETURN_IF_ERROR(Sync());
    const size_t width = lossy::ElementSize(type);
    if (h_count > positions.size() || h_count * width > raw.size())
      return Status::InvalidArgument("cuda compact: output spans too small for " + std::to_string(h_count) +
                                     " exact elements");
    RETURN_IF_ERROR(Download(positions.data(), d_positions_, h_count * sizeof(uint32_t)));
    RETURN_IF_ERROR(Download(raw.data(), d_raw_, h_count * width));
    *count = h_count;
    return Sync();
  }

  Status Dequantize(ElementType type, uint32_t bits, std::span<const float> levels, ByteSpan packed, ByteSpan base,
                    MutableByteSpan out, uint32_t* max_symbol) override {
    const uint64_t n = out.size() / lossy::ElementSize(type);
    RETURN_IF_ERROR(Reserve(n));
    RETURN_IF_ERROR(Upload(d_packed_, packed));
    RETURN_IF_ERROR(Upload(d_base_, base));
    RETURN_IF_ERROR(Upload(d_levels_, std::as_bytes(levels)));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_counters_.get(), 0, sizeof(unsigned int), stream_));
    CUDA_RETURN_IF_ERROR(LaunchDequantize(type, bits, d_levels_.get<float>(), d_packed_.get<uint8_t>(),
                                          base.empty() ? nullptr : d_base_.get(), n, d_recon_.get(),
                                          d_counters_.get<unsigned int>(), stream_));
    unsigned int h_max = 0;
    RETURN_IF_ERROR(Download(out.data(), d_recon_, out.size()));
    RETURN_IF_ERROR(Download(&h_max, d_counters_, sizeof h_max));
    RETURN_IF_ERROR(Sync());
    *max_symbol = h_max;
    return Status::Ok();
  }

 private:
  // Sizes the per-element buffers for n elements of up to 4 bytes.
  Status Reserve(uint64_t n) {
    if (n <= capacity_) return Status::Ok();
    const size_t bytes = n * sizeof(float);
    RETURN_IF_ERROR(d_values_.Reserve(bytes));
    RETURN_IF_ERROR(d_base_.Reserve(bytes));
    RETURN_IF_ERROR(d_residual_.Reserve(bytes));
    RETURN_IF_ERROR(d_recon_.Reserve(bytes));
    RETURN_IF_ERROR(d_raw_.Reserve(bytes));
    RETURN_IF_ERROR(d_positions_.Reserve(n * sizeof(uint32_t)));
    RETURN_IF_ERROR(d_packed_.Reserve(lossy::PackedBytes(n, 8)));
    RETURN_IF_ERROR(d_partials_.Reserve(lossy::ReduceBlocks(n) * sizeof(double)));
    capacity_ = n;
    return Status::Ok();
  }
  Status UploadInputs(const lossy::QuantizeTable& table, ByteSpan values, ByteSpan base,
                      std::span<const float> residual) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_table_.get(), &table, sizeof table, cudaMemcpyHostToDevice, stream_));
    RETURN_IF_ERROR(Upload(d_values_, values));
    RETURN_IF_ERROR(Upload(d_base_, base));
    return Upload(d_residual_, std::as_bytes(residual));
  }
  Status Upload(const DeviceBuffer& dst, ByteSpan src) {
    if (src.empty()) return Status::Ok();
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.data(), src.size(), cudaMemcpyHostToDevice, stream_));
    return Status::Ok();
  }
  Status Download(void* dst, const DeviceBuffer& src, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src.get(), bytes, cudaMemcpyDeviceToHost, stream_));
    return Status::Ok();
  }
  Status Sync() {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  std::string name_;
  cudaStream_t stream_ = nullptr;
  uint64_t capacity_ = 0;
  DeviceBuffer d_values_, d_base_, d_residual_, d_recon_, d_raw_, d_positions_, d_packed_, d_partials_;
  DeviceBuffer d_histogram_, d_table_, d_counters_, d_levels_, d_compact_;
};

}  // namespace

Result<std::unique_ptr<lossy::LossyKernels>> MakeCudaLossyKernels(uint64_t max_chunk_elements) {
  DeviceInfo device = ProbeDevice();
  if (!device.present) return Status::Unsupported("lossy kernels: " + device.why_absent);
  auto kernels = std::make_unique<CudaLossyKernels>("cuda:" + device.name);
  RETURN_IF_ERROR(kernels->Init(max_chunk_elements));
  return std::unique_ptr<lossy::LossyKernels>(std::move(kernels));
}

}  // namespace ckptfs::gpu

// The CUDA kernels of the lossy codec against the CPU reference, bit for bit,
// over fixed seeds and edge sizes, plus cross-decoding (GPU encode -> CPU
// decode and back). Without a device every comparison skips and says why.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/search.h"
#include "gpu/device.h"
#include "gpu/lossy_backend.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

std::unique_ptr<LossyKernels> CudaOrNull(std::string* why) {
  Result<std::unique_ptr<LossyKernels>> k = gpu::MakeCudaLossyKernels(1u << 20);
  if (!k.ok()) {
    gpu::DeviceInfo device = gpu::ProbeDevice();
    *why = device.present ? k.status().message() : device.why_absent;
    return nullptr;
  }
  return std::move(k).value();
}

#define REQUIRE_CUDA(var)                                     \
  std::string why_##var;                                      \
  std::unique_ptr<LossyKernels> var = CudaOrNull(&why_##var); \
  if (!var) GTEST_SKIP() << (why_##var.starts_with("no CUDA device") ? "" : "no CUDA device: ") << why_##var

// Sizes around the pack group (8), the compaction tile (256), the reduction
// block (4096) and a large chunk.
const uint64_t kSizes[] = {0, 1, 7, 8, 9, 255, 256, 257, 4095, 4096, 4097, (1u << 20) + 3};
const ElementType kTypes[] = {ElementType::kF32, ElementType::kF16, ElementType::kBF16};

struct Case {
  ElementType type;
  std::vector<std::byte> values, base;
};

Case MakeCase(ElementType type, uint64_t n, uint32_t seed, bool delta) {
  Case c;
  c.type = type;
  std::vector<float> v = testing::Generate(seed % 2 ? Dist::kHeavyTail : Dist::kNonFinite, n, seed);
  c.values = testing::ToElements(type, v);
  if (delta) {
    std::vector<float> b = v;
    for (size_t i = 0; i < b.size(); ++i)
      if (i % 3) b[i] += 1e-3f * static_cast<float>(i % 7);
    c.base = testing::ToElements(type, b);
  }
  return c;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

TEST(LossyGpuTest, KernelsMatchCpuBitForBit) {
  REQUIRE_CUDA(gpu);
  std::unique_ptr<LossyKernels> cpu = MakeCpuKernels();
  for (ElementType type : kTypes) {
    for (uint64_t n : kSizes) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        for (bool delta : {false, true}) {
          SCOPED_TRACE("type=" + std::to_string(static_cast<int>(type)) + " n=" + std::to_string(n) +
                       " seed=" + std::to_string(seed) + " delta=" + std::to_string(delta));
          Case c = MakeCase(type, n, seed, delta);
          const uint64_t blocks = ReduceBlocks(n);
          std::vector<float> r_cpu(n), r_gpu(n);
          std::vector<double> p_cpu(blocks), p_gpu(blocks);
          ASSERT_TRUE(cpu->Residual(type, c.values, c.base, r_cpu, p_cpu).ok());
          ASSERT_TRUE(gpu->Residual(type, c.values, c.base, r_gpu, p_gpu).ok());
          ASSERT_TRUE(SameBits(r_cpu, r_gpu));
          ASSERT_TRUE(SameBits(p_cpu, p_gpu));

          std::vector<uint32_t> h_cpu(kHistogramBins), h_gpu(kHistogramBins);
          ASSERT_TRUE(cpu->Histogram(r_cpu, h_cpu).ok());
          ASSERT_TRUE(gpu->Histogram(r_cpu, h_gpu).ok());
          ASSERT_EQ(h_cpu, h_gpu);

          double norm = 0;
          for (double p : p_cpu) norm += p;
          std::optional<SearchResult> found =
              SearchConfig(h_cpu, n, static_cast<uint32_t>(ElementSize(type)), {1e-4 * norm, INFINITY});
          if (!found) continue;
          const QuantizeTable& t = found->table;
          std::vector<std::byte> pk_cpu(PackedBytes(n, t.bits)), pk_gpu(pk_cpu.size());
          std::vector<std::byte> rc_cpu(c.values.size()), rc_gpu(c.values.size());
          double max_cpu = -1, max_gpu = -2;
          ClassCounts cc, cg;
          ASSERT_TRUE(cpu->QuantizePack(type, t, c.values, c.base, r_cpu, pk_cpu, rc_cpu, p_cpu, &max_cpu, &cc).ok());
          ASSERT_TRUE(gpu->QuantizePack(type, t, c.values, c.base, r_cpu, pk_gpu, rc_gpu, p_gpu, &max_gpu, &cg).ok());
          ASSERT_EQ(pk_cpu, pk_gpu);
          ASSERT_EQ(rc_cpu, rc_gpu);
          ASSERT_TRUE(SameBits(p_cpu, p_gpu));
          ASSERT_EQ(std::memcmp(&max_cpu, &max_gpu, sizeof max_cpu), 0);
          ASSERT_EQ(cc.pruned, cg.pruned);
          ASSERT_EQ(cc.quantized, cg.quantized);
          ASSERT_EQ(cc.exact, cg.exact);

          std::vector<uint32_t> pos_cpu(cc.exact), pos_gpu(cc.exact);
          std::vector<std::byte> raw_cpu(cc.exact * ElementSize(type)), raw_gpu(raw_cpu.size());
          uint64_t k_cpu = 0, k_gpu = 0;
          ASSERT_TRUE(cpu->CompactExact(type, t, c.values, r_cpu, pos_cpu, raw_cpu, &k_cpu).ok());
          ASSERT_TRUE(gpu->CompactExact(type, t, c.values, r_cpu, pos_gpu, raw_gpu, &k_gpu).ok());
          ASSERT_EQ(k_cpu, k_gpu);
          ASSERT_EQ(pos_cpu, pos_gpu);
          ASSERT_EQ(raw_cpu, raw_gpu);

          std::vector<std::byte> out_cpu(c.values.size()), out_gpu(c.values.size());
          uint32_t ms_cpu = 0, ms_gpu = 0;
          std::span<const float> levels(t.levels, kMaxLevels);
          ASSERT_TRUE(cpu->Dequantize(type, t.bits, levels, pk_cpu, c.base, out_cpu, &ms_cpu).ok());
          ASSERT_TRUE(gpu->Dequantize(type, t.bits, levels, pk_cpu, c.base, out_gpu, &ms_gpu).ok());
          ASSERT_EQ(out_cpu, out_gpu);
          ASSERT_EQ(ms_cpu, ms_gpu);
        }
      }
    }
  }
}

TEST(LossyGpuTest, EncodeMatchesAndCrossDecodes) {
  REQUIRE_CUDA(gpu);
  Scratch scratch;
  for (ElementType type : kTypes) {
    for (uint64_t n : kSizes) {
      for (double rel : {1e-1, 1e-2, 1e-3}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " rel=" + std::to_string(rel));
        Case c = MakeCase(type, n, 7, n % 2 == 1);
        Result<EncodedChunk> on_cpu = EncodeChunk(type, c.values, c.base, {rel, 0}, &scratch);
        EncodeOptions use_gpu;
        use_gpu.kernels = gpu.get();
        Result<EncodedChunk> on_gpu = EncodeChunk(type, c.values, c.base, {rel, 0}, &scratch, use_gpu);
        ASSERT_TRUE(on_cpu.ok() && on_gpu.ok());
        ASSERT_EQ(on_cpu->bytes, on_gpu->bytes);
        ASSERT_EQ(on_cpu->reconstruction, on_gpu->reconstruction);
        std::vector<std::byte> out(c.values.size());
        ASSERT_TRUE(DecodeChunk(type, on_gpu->bytes, c.base, out, &scratch).ok());  // GPU -> CPU
        ASSERT_EQ(out, on_gpu->reconstruction);
        ASSERT_TRUE(DecodeChunk(type, on_cpu->bytes, c.base, out, &scratch, gpu.get()).ok());  // CPU -> GPU
        ASSERT_EQ(out, on_cpu->reconstruction);
      }
    }
  }
}

// An alternative base (the container's step prediction offers the previous
// version next to the prediction): both backends pick the same base and
// write the same bytes.
TEST(LossyGpuTest, AlternativeBaseMatchesCpu) {
  REQUIRE_CUDA(gpu);
  Scratch scratch;
  for (ElementType type : kTypes) {
    for (uint64_t n : kSizes) {
      SCOPED_TRACE("n=" + std::to_string(n));
      Case c = MakeCase(type, n, 11, true);
      Case other = MakeCase(type, n, 12, true);  // a worse base for the same values
      for (bool prediction_first : {true, false}) {
        ByteSpan base = prediction_first ? ByteSpan(other.base) : ByteSpan(c.base);
        ByteSpan alternative = prediction_first ? ByteSpan(c.base) : ByteSpan(other.base);
        EncodeOptions cpu;
        cpu.alternative_base = alternative;
        EncodeOptions use_gpu = cpu;
        use_gpu.kernels = gpu.get();
        Result<EncodedChunk> on_cpu = EncodeChunk(type, c.values, base, {1e-2, 0}, &scratch, cpu);
        Result<EncodedChunk> on_gpu = EncodeChunk(type, c.values, base, {1e-2, 0}, &scratch, use_gpu);
        ASSERT_TRUE(on_cpu.ok() && on_gpu.ok());
        ASSERT_EQ(on_cpu->stats.used_alternative_base, on_gpu->stats.used_alternative_base);
        ASSERT_EQ(on_cpu->bytes, on_gpu->bytes);
        ASSERT_EQ(on_cpu->reconstruction, on_gpu->reconstruction);
      }
    }
  }
}

TEST(LossyGpuTest, BackendSelection) {
  Result<std::unique_ptr<LossyKernels>> off = gpu::SelectLossyKernels(GpuMode::kOff);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->name(), "cpu");
  gpu::DeviceInfo device = gpu::ProbeDevice();
  Result<std::unique_ptr<LossyKernels>> on = gpu::SelectLossyKernels(GpuMode::kOn);
  Result<std::unique_ptr<LossyKernels>> automatic = gpu::SelectLossyKernels(GpuMode::kAuto);
  ASSERT_TRUE(automatic.ok());
  if (device.present) {
    ASSERT_TRUE(on.ok()) << on.status().ToString();
    EXPECT_EQ((*on)->name(), "cuda:" + device.name);
    EXPECT_EQ((*automatic)->name(), "cuda:" + device.name);
  } else {
    EXPECT_FALSE(on.ok());
    EXPECT_NE(on.status().message().find(device.why_absent), std::string::npos);
    EXPECT_EQ((*automatic)->name(), "cpu");
  }
  EXPECT_EQ(*ParseGpuMode("auto"), GpuMode::kAuto);
  EXPECT_EQ(*ParseGpuMode("on"), GpuMode::kOn);
  EXPECT_EQ(*ParseGpuMode("off"), GpuMode::kOff);
  EXPECT_FALSE(ParseGpuMode("yes").ok());
}

// Throughput for scripts/gpu-check.sh: runs only when CKPTFS_GPU_BENCH_JSON
// names the output file.
TEST(LossyGpuBenchmark, KernelsAndEndToEnd) {
  const char* path = std::getenv("CKPTFS_GPU_BENCH_JSON");
  if (path == nullptr) GTEST_SKIP() << "benchmark: set CKPTFS_GPU_BENCH_JSON=<file> to run it";
  REQUIRE_CUDA(gpu);
  const uint64_t n = 16u << 20;
  Case c = MakeCase(ElementType::kF32, n, 1, true);
  std::unique_ptr<LossyKernels> cpu = MakeCpuKernels();
  std::vector<float> r(n);
  std::vector<double> p(ReduceBlocks(n));
  std::vector<uint32_t> h(kHistogramBins);
  ASSERT_TRUE(cpu->Residual(ElementType::kF32, c.values, c.base, r, p).ok());
  ASSERT_TRUE(cpu->Histogram(r, h).ok());
  double norm = 0;
  for (double x : p) norm += x;
  std::optional<SearchResult> found = SearchConfig(h, n, 4, {1e-4 * norm, INFINITY});
  ASSERT_TRUE(found.has_value());
  Result<std::string> kernels = gpu::BenchmarkLossyKernels(ElementType::kF32, c.values, c.base, found->table, 20);
  ASSERT_TRUE(kernels.ok()) << kernels.status().ToString();

  // End to end through the codec API (host spans; includes PCIe copies,
  // the host search and zstd), 1M-element chunks.
  const uint64_t chunk = 1u << 20;
  Scratch scratch;
  EncodeOptions use_gpu;
  use_gpu.kernels = gpu.get();
  auto seconds = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<EncodedChunk> encoded;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t at = 0; at < n; at += chunk) {
    ByteSpan v(c.values.data() + at * 4, chunk * 4), b(c.base.data() + at * 4, chunk * 4);
    Result<EncodedChunk> e = EncodeChunk(ElementType::kF32, v, b, {1e-2, 0}, &scratch, use_gpu);
    ASSERT_TRUE(e.ok());
    encoded.push_back(std::move(e).value());
  }
  double encode_s = seconds(t0);
  std::vector<std::byte> out(chunk * 4);
  t0 = std::chrono::steady_clock::now();
  for (uint64_t at = 0, i = 0; at < n; at += chunk, ++i) {
    ByteSpan b(c.base.data() + at * 4, chunk * 4);
    ASSERT_TRUE(DecodeChunk(ElementType::kF32, encoded[i].bytes, b, out, &scratch, gpu.get()).ok());
  }
  double decode_s = seconds(t0);
  std::ofstream f(path);
  f << "{\"kernels\": " << *kernels << ", \"end_to_end\": {\"encode_gb_per_s\": " << (n * 4 / encode_s / 1e9)
    << ", \"decode_gb_per_s\": " << (n * 4 / decode_s / 1e9) << ", \"chunk_elements\": " << chunk << "}}\n";
  ASSERT_TRUE(f.good());
}

}  // namespace
}  // namespace ckptfs::lossy

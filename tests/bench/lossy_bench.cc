// Throughput and size of the lossy tensor codec, one thread, printed as JSON.
//   lossy_bench [--elements N] [--chunks C] [--rel R] [--gpu auto|on|off]
//               [--input FILE.f32 [--base FILE.f32]] [--wall 0|1] [--type f32|f16|bf16]
// Without --input it uses Gaussian weights (key frame) and a drifted copy
// (delta frame). Per-kernel times come from the selected backend; "encode"
// and "decode" are whole EncodeChunk/DecodeChunk calls with reused scratch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/common/io.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/level_gain.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/search.h"
#include "gpu/lossy_backend.h"
#include "tests/bench/bench_clock.h"

namespace {

using namespace ckptfs;
using namespace ckptfs::lossy;
struct Options {
  uint64_t elements = 1u << 20;
  uint64_t chunks = 16;
  double rel = 1e-2;
  std::string gpu = "off";
  std::string input, base;
  // The bench's element type (f32 inputs are rounded to it).
  ElementType type = ElementType::kF32;
  // The calling thread's CPU time by default (--wall 1 with a GPU backend).
  bench::ClockKind clock = bench::ClockKind::kThreadCpu;
};

std::vector<std::byte> ConvertF32(const std::vector<std::byte>& f32, ElementType type) {
  if (type == ElementType::kF32) return f32;
  const size_t n = f32.size() / 4;
  std::vector<std::byte> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, f32.data() + 4 * i, 4);
    const uint16_t h = type == ElementType::kF16 ? FloatToHalf(f) : FloatToBf16(f);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

std::vector<std::byte> ReadF32(const std::string& path) {
  Result<std::vector<std::byte>> bytes = ReadWholeFile(path);
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().ToString().c_str());
    std::exit(2);
  }
  std::vector<std::byte> v = std::move(bytes).value();
  v.resize(v.size() / 4 * 4);
  return v;
}

struct Frame {
  double encode_s = 0, decode_s = 0;
  uint64_t bytes = 0, encoded = 0;
  double worst_rel = 0;
};

// Encodes and decodes `values` (against `base` when not empty) chunk by chunk.
Frame RunFrame(const std::vector<std::byte>& values, const std::vector<std::byte>& base, const Options& o,
               LossyKernels* kernels, std::vector<std::byte>* recon_out) {
  const ElementType type = o.type;
  auto now = [&] { return bench::NowSeconds(o.clock); };
  Frame f;
  Scratch scratch;
  EncodeOptions opt;
  opt.kernels = kernels;
  const uint64_t chunk_bytes = o.elements * ElementSize(type);
  std::vector<EncodedChunk> chunks;
  recon_out->assign(values.size(), std::byte{0});
  auto t0 = now();
  for (uint64_t at = 0; at < values.size(); at += chunk_bytes) {
    uint64_t len = std::min<uint64_t>(chunk_bytes, values.size() - at);
    ByteSpan v(values.data() + at, len);
    ByteSpan b = base.empty() ? ByteSpan{} : ByteSpan(base.data() + at, len);
    opt.reconstruction_out = MutableByteSpan(recon_out->data() + at, len);
    Result<EncodedChunk> e = EncodeChunk(type, v, b, {o.rel, 0}, &scratch, opt);
    if (!e.ok()) {
      std::fprintf(stderr, "encode: %s\n", e.status().ToString().c_str());
      std::exit(1);
    }
    f.encoded += e->bytes.size();
    f.worst_rel = std::max(f.worst_rel, e->stats.rel_l2);
    chunks.push_back(std::move(e).value());
  }
  f.encode_s = now() - t0;
  std::vector<std::byte> decoded(values.size());
  t0 = now();
  for (uint64_t at = 0, i = 0; at < values.size(); at += chunk_bytes, ++i) {
    uint64_t len = std::min<uint64_t>(chunk_bytes, values.size() - at);
    ByteSpan b = base.empty() ? ByteSpan{} : ByteSpan(base.data() + at, len);
    Status st = DecodeChunk(type, chunks[i].bytes, b, MutableByteSpan(decoded.data() + at, len), &scratch,
                            kernels);
    if (!st.ok()) {
      std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  f.decode_s = now() - t0;
  if (decoded != *recon_out) {
    std::fprintf(stderr, "decode differs from the encoder's reconstruction\n");
    std::exit(1);
  }
  f.bytes = values.size();
  return f;
}

// Times each kernel once over one chunk (repeated `reps` times).
std::string KernelTimes(const std::vector<std::byte>& values, const std::vector<std::byte>& base, uint64_t n,
                        const Options& o, LossyKernels& k) {
  const ElementType type = o.type;
  const double rel = o.rel;
  auto now = [&] { return bench::NowSeconds(o.clock); };
  const int reps = 5;
  const size_t w = ElementSize(type);
  ByteSpan v(values.data(), n * w);
  ByteSpan b = base.empty() ? ByteSpan{} : ByteSpan(base.data(), n * w);
  std::vector<float> r(n);
  std::vector<double> p(ReduceBlocks(n));
  std::vector<uint32_t> h(kHistogramBins);
  std::string json;
  auto report = [&](const char* name, double s) {
    json += "\"" + std::string(name) + "\": {\"gb_per_s\": " + std::to_string(n * double(w) * reps / s / 1e9) + "}, ";
  };
  auto t0 = now();
  for (int i = 0; i < reps; ++i) (void)k.Residual(type, v, b, r, p);
  report("residual", now() - t0);
  t0 = now();
  for (int i = 0; i < reps; ++i) (void)k.Histogram(r, h);
  report("histogram", now() - t0);
  double norm = 0;
  for (double x : p) norm += x;
  std::optional<SearchResult> found;
  t0 = now();
  for (int i = 0; i < reps; ++i) found = SearchConfig(h, n, 4, {rel * rel * norm * 0.85, INFINITY});
  report("search", now() - t0);
  if (!found) return json + "\"search_result\": \"lossless\"";
  const QuantizeTable& t = found->table;
  std::vector<std::byte> packed(PackedBytes(n, t.bits)), recon(n * w), raw(n * w), out(n * w);
  std::vector<uint32_t> pos(n);
  double mx;
  ClassCounts cc;
  t0 = now();
  for (int i = 0; i < reps; ++i) (void)k.QuantizePack(type, t, v, b, r, packed, recon, p, &mx, &cc);
  report("quantize_pack", now() - t0);
  // The encoder's second pass with the unbiasing gain's levels (the same
  // symbols, kernels.h Relevel).
  if (std::optional<QuantizeTable> scaled = ScaledLevels(t, 1.05)) {
    t0 = now();
    for (int i = 0; i < reps; ++i) (void)k.Relevel(type, *scaled, v, b, r, packed, recon, p, &mx, &cc);
    report("relevel", now() - t0);
  }
  uint64_t count = 0;
  t0 = now();
  for (int i = 0; i < reps; ++i) (void)k.CompactExact(type, t, v, r, pos, raw, &count);
  report("compact_exact", now() - t0);
  uint32_t ms;
  t0 = now();
  for (int i = 0; i < reps; ++i)
    (void)k.Dequantize(type, t.bits, std::span<const float>(t.levels, kMaxLevels), packed, b, out, &ms);
  report("dequantize", now() - t0);
  return json + "\"bits\": " + std::to_string(t.bits);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--elements")
      o.elements = std::stoull(v);
    else if (a == "--chunks")
      o.chunks = std::stoull(v);
    else if (a == "--rel")
      o.rel = std::stod(v);
    else if (a == "--gpu")
      o.gpu = v;
    else if (a == "--input")
      o.input = v;
    else if (a == "--base")
      o.base = v;
    else if (a == "--wall")
      o.clock = v == "1" ? bench::ClockKind::kWall : bench::ClockKind::kThreadCpu;
    else if (a == "--type")
      o.type = v == "f16" ? ElementType::kF16 : v == "bf16" ? ElementType::kBF16 : ElementType::kF32;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  Result<GpuMode> mode = ParseGpuMode(o.gpu);
  if (!mode.ok()) return std::fprintf(stderr, "%s\n", mode.status().ToString().c_str()), 2;
  Result<std::unique_ptr<LossyKernels>> kernels = gpu::SelectLossyKernels(*mode, o.elements);
  if (!kernels.ok()) return std::fprintf(stderr, "%s\n", kernels.status().ToString().c_str()), 2;

  std::vector<std::byte> key, next;
  if (!o.input.empty()) {
    key = ConvertF32(ReadF32(o.input), o.type);
    if (!o.base.empty()) next = ConvertF32(ReadF32(o.base), o.type);
  } else {
    uint64_t n = o.elements * o.chunks;
    std::vector<float> w(n);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f), step(0.0f, 2e-4f);
    for (float& x : w) x = normal(rng);
    key.resize(n * 4);
    std::memcpy(key.data(), w.data(), n * 4);
    key = ConvertF32(key, o.type);
    for (uint64_t i = 0; i < n; ++i)
      if (i % 4 != 0) w[i] += step(rng);  // a quarter of the elements frozen
    next.resize(n * 4);
    std::memcpy(next.data(), w.data(), n * 4);
    next = ConvertF32(next, o.type);
  }
  std::vector<std::byte> key_recon, next_recon;
  Frame kf = RunFrame(key, {}, o, kernels->get(), &key_recon);
  const char* type_name = o.type == ElementType::kF32 ? "f32" : o.type == ElementType::kF16 ? "f16" : "bf16";
  std::printf("{\"backend\": \"%s\", \"type\": \"%s\", \"clock\": \"%s\", \"rel_l2\": %g, \"chunk_elements\": %llu,\n",
              std::string((*kernels)->name()).c_str(), type_name, o.clock == bench::ClockKind::kWall ? "wall" : "thread_cpu", o.rel,
              static_cast<unsigned long long>(o.elements));
  auto print_frame = [&o](const char* name, const Frame& f) {
    std::printf(
        " \"%s\": {\"bytes\": %llu, \"encoded\": %llu, \"bits_per_element\": %.4f, \"ratio\": %.2f, "
        "\"worst_rel_l2\": %.3g, \"encode_gb_per_s\": %.3f, \"decode_gb_per_s\": %.3f},\n",
        name, static_cast<unsigned long long>(f.bytes), static_cast<unsigned long long>(f.encoded),
        f.encoded * 8.0 / (f.bytes / double(ElementSize(o.type))), static_cast<double>(f.bytes) / f.encoded, f.worst_rel,
        f.bytes / f.encode_s / 1e9, f.bytes / f.decode_s / 1e9);
  };
  print_frame("key_frame", kf);
  if (!next.empty() && next.size() == key.size()) {
    Frame df = RunFrame(next, key_recon, o, kernels->get(), &next_recon);
    print_frame("delta_frame", df);
    std::printf(
        " \"kernels_delta\": {%s},\n",
        KernelTimes(next, key_recon, std::min<uint64_t>(o.elements, next.size() / ElementSize(o.type)), o, **kernels).c_str());
  }
  std::printf(" \"kernels_key\": {%s}}\n",
              KernelTimes(key, {}, std::min<uint64_t>(o.elements, key.size() / ElementSize(o.type)), o, **kernels).c_str());
  return 0;
}

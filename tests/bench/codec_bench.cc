// codec_bench FILE DTYPE [CHUNK_BYTES] [BASE_FILE]
// Encodes the raw tensor bytes of FILE (one tensor of DTYPE: f32, f16, bf16
// or u8) chunk by chunk on one thread and prints JSON: encode/decode MB/s
// (by wall time, and by the thread's CPU time) and ratio of the chunk
// codecs, of plain zstd -3 on the same chunks, and of a whole EncodeBlob +
// DecodeAll round trip. With BASE_FILE, chunks may be
// XOR-delta encoded against it.
#include <fmt/format.h>
#include <zstd.h>


#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "codec/common/io.h"
#include "codec/container/blob.h"
#include "codec/common/hash.h"
#include "codec/tensor/chunk_encoder.h"
#include "tests/bench/bench_clock.h"

using namespace ckptfs;

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The calling thread's CPU seconds (bench_clock.h): old and new builds
// compare even when the machine is busy.
double ThreadCpuSeconds() { return bench::NowSeconds(bench::ClockKind::kThreadCpu); }

DType ParseDType(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "f16") return DType::kF16;
  if (s == "bf16") return DType::kBF16;
  return DType::kU8;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: codec_bench FILE DTYPE [CHUNK_BYTES] [BASE_FILE]\n");
    return 2;
  }
  Result<std::vector<std::byte>> file = ReadWholeFile(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  const DType dtype = ParseDType(argv[2]);
  const uint64_t chunk_bytes = argc > 3 ? std::stoull(argv[3]) : (4ull << 20);
  std::vector<std::byte> base_file;
  if (argc > 4) base_file = *ReadWholeFile(argv[4]);
  const size_t elem = std::max<size_t>(1, DTypeSize(dtype));
  const size_t size = file->size() / elem * elem;
  const size_t step = chunk_bytes / elem * elem;
  const int repeats = 3;

  CodecScratch scratch;
  ScratchBuffer out;
  std::vector<std::pair<ChunkEncoding, std::vector<std::byte>>> encoded;
  double best_encode = 1e9, best_encode_cpu = 1e9;
  for (int r = 0; r < repeats; ++r) {
    encoded.clear();
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuSeconds();
    for (size_t at = 0; at < size; at += step) {
      size_t n = std::min(step, size - at);
      ByteSpan base;
      if (base_file.size() >= at + n) base = ByteSpan(base_file).subspan(at, n);
      ChunkEncoding e = *EncodeChunkBest(ByteSpan(*file).subspan(at, n), dtype, 3, base, scratch, &out);
      if (r == repeats - 1) encoded.emplace_back(e, std::vector<std::byte>(out.data(), out.data() + e.stored_size));
    }
    best_encode = std::min(best_encode, Seconds(t0));
    best_encode_cpu = std::min(best_encode_cpu, ThreadCpuSeconds() - c0);
  }
  size_t stored = 0;
  std::string codecs;
  for (auto& [e, bytes] : encoded) {
    stored += bytes.size();
    codecs += fmt::format("{}\"{}\"", codecs.empty() ? "" : ",", ChunkCodecName(e.codec));
  }
  std::vector<std::byte> decoded(size);
  double best_decode = 1e9, best_decode_cpu = 1e9;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuSeconds();
    size_t at = 0;
    for (auto& [e, bytes] : encoded) {
      size_t n = std::min(step, size - at);
      ChunkContext ctx{dtype, 3, {}};
      if (e.codec == ChunkCodec::kBytePlaneXorZstd) ctx.base = ByteSpan(base_file).subspan(at, n);
      Status s = FindChunkCodec(e.codec)->Decode(bytes, {}, ctx, scratch, MutableByteSpan(decoded).subspan(at, n));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      at += n;
    }
    best_decode = std::min(best_decode, Seconds(t0));
    best_decode_cpu = std::min(best_decode_cpu, ThreadCpuSeconds() - c0);
  }
  if (std::memcmp(decoded.data(), file->data(), size) != 0) {
    std::fprintf(stderr, "round trip mismatch\n");
    return 1;
  }

  // Plain zstd -3 of the same chunks, for comparison.
  std::vector<std::byte> z(ZSTD_compressBound(step));
  size_t zstored = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t at = 0; at < size; at += step) {
    size_t n = std::min(step, size - at);
    zstored += ZSTD_compress(z.data(), z.size(), file->data() + at, n, 3);
  }
  double zstd_encode = Seconds(t0);

  // The whole container path: best of `repeats` runs (warm buffers) with a
  // sink that keeps its capacity, on 1 and 2 threads; decode by ReadAt into
  // a reused buffer plus the whole-file checksum (what DecodeAll does,
  // minus allocating the output).
  class ReusedSink final : public ByteSink {
   public:
    Status Append(ByteSpan data) override {
      bytes.insert(bytes.end(), data.begin(), data.end());
      return Status::Ok();
    }
    std::vector<std::byte> bytes;
  } sink;
  Layout layout;
  layout.tensors.push_back(TensorInfo{"t", dtype, {size / elem}, false});
  layout.segments.push_back(Segment{0, size, 0});
  double blob_encode = 1e9, blob_encode2 = 1e9, blob_decode = 1e9;
  EncodeStats stats;
  for (unsigned threads : {1u, 2u}) {
    for (int r = 0; r < repeats; ++r) {
      sink.bytes.clear();
      auto t = std::chrono::steady_clock::now();
      stats = *EncodeBlob(ByteSpan(*file).first(size), layout, nullptr, EncodeOptions{3, chunk_bytes, threads}, &sink);
      double& best = threads == 1 ? blob_encode : blob_encode2;
      best = std::min(best, Seconds(t));
    }
  }
  auto reader = *BlobReader::Open(MemoryFile::Borrow(sink.bytes), std::nullopt, nullptr);
  for (int r = 0; r < repeats; ++r) {
    auto t = std::chrono::steady_clock::now();
    if (!reader->ReadAt(0, decoded).ok() || Checksum64(decoded) != reader->file_checksum()) return 1;
    blob_decode = std::min(blob_decode, Seconds(t));
  }
  t0 = std::chrono::steady_clock::now();
  auto all = *DecodeAll(*reader);
  double decode_all = Seconds(t0);

  const double mb = static_cast<double>(size) / 1e6;
  std::printf(
      "{\"file\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"chunk_bytes\":%llu,"
      "\"codec\":{\"ratio\":%.4f,\"encode_mbps\":%.0f,\"decode_mbps\":%.0f,\"encode_cpu_mbps\":%.0f,"
      "\"decode_cpu_mbps\":%.0f},"
      "\"zstd3\":{\"ratio\":%.4f,\"encode_mbps\":%.0f},"
      "\"blob\":{\"ratio\":%.4f,\"encode_mbps\":%.0f,\"encode_2threads_mbps\":%.0f,\"decode_mbps\":%.0f,"
      "\"decode_all_cold_mbps\":%.0f},"
      "\"chunk_codecs\":[%s]}\n",
      argv[1], argv[2], size, static_cast<unsigned long long>(chunk_bytes), static_cast<double>(size) / stored,
      mb / best_encode, mb / best_decode, mb / best_encode_cpu, mb / best_decode_cpu, static_cast<double>(size) / zstored, mb / zstd_encode,
      static_cast<double>(size) / stats.stored_bytes, mb / blob_encode, mb / blob_encode2, mb / blob_decode,
      mb / decode_all,
      codecs.c_str());
  return all.size() == size ? 0 : 1;
}

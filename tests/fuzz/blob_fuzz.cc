// libFuzzer target for the blob decoder: BlobReader::Open on arbitrary bytes
// with tight limits, then every chunk verified and the whole file decoded
// (no resolver, so delta chunks end in NotFound). Any crash, sanitizer
// report or Internal status is a bug. Each input is tried as is and once
// more with the footer's index checksum recomputed, so that mutations reach
// the index validation behind the checksum.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/container/blob.h"

using namespace ckptfs;

namespace {

void Check(ByteSpan bytes) {
  DecodeLimits limits;
  limits.max_logical_size = 64ull << 20;
  limits.max_chunk_bytes = 16ull << 20;
  limits.max_index_bytes = 16u << 20;
  auto file = MemoryFile::Borrow(bytes);
  auto reader = BlobReader::Open(std::shared_ptr<const RandomAccessFile>(std::move(file)), std::nullopt, nullptr,
                                 nullptr, limits);
  if (!reader.ok()) {
    if (reader.status().code() == StatusCode::kInternal) std::abort();
    return;
  }
  for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) {
    Status s = (*reader)->VerifyChunk(c);
    if (s.code() == StatusCode::kInternal) std::abort();
  }
  auto all = DecodeAll(**reader);
  if (!all.ok() && all.status().code() == StatusCode::kInternal) std::abort();
  if (all.ok() && Checksum64(*all) != (*reader)->file_checksum()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan bytes(reinterpret_cast<const std::byte*>(data), size);
  Check(bytes);
  // Footer: index offset (u64), index length (u64), index checksum (u64), ...
  constexpr size_t kFooter = 40;
  if (size < kFooter) return 0;
  const std::byte* footer = bytes.data() + size - kFooter;
  uint64_t offset = LoadLE64(footer), length = LoadLE64(footer + 8);
  if (offset > size - kFooter || length > size - kFooter - offset) return 0;
  std::vector<std::byte> fixed(bytes.begin(), bytes.end());
  StoreLE64(fixed.data() + size - kFooter + 16, Checksum64(bytes.subspan(offset, length)));
  Check(fixed);
  return 0;
}

// BlobReader: opens a blob (header, footer, index: a few reads, everything
// validated), then serves random-access reads chunk by chunk from the
// chunk cache, decoding each chunk once however many readers ask
// (blob_chunk_decode.cc decodes one chunk, following delta chunks into the
// base version through the resolver).
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "codec/common/hash.h"
#include "codec/container/blob_reader_impl.h"

namespace ckptfs {
namespace blob_internal {

namespace {
// The cached chunks this thread is decoding (reader, chunk), innermost
// last. A chunk that its own decode reaches again through bases and refs
// (a cycle, possible only in a store whose objects do not match their
// names) would wait for itself: it fails instead.
thread_local std::vector<std::pair<const void*, uint32_t>> tls_decoding;

struct DecodingMark {
  DecodingMark(const void* reader, uint32_t c) { tls_decoding.emplace_back(reader, c); }
  ~DecodingMark() { tls_decoding.pop_back(); }
};

// How long a read below the top of a chain waits for another thread's
// decode of the same chunk before decoding it itself: two threads whose
// decodes reach each other's chunk (a cycle across threads) go on instead
// of waiting for each other.
constexpr std::chrono::seconds kLinkedWait{5};
}  // namespace

Result<std::shared_ptr<const ChunkBuffer>> BlobReaderImpl::CachedChunk(uint32_t c, uint32_t depth,
                                                                      ChunkUse use) const {
  if (auto hit = cache_->Get(*id_, c)) {
    if (depth == 0) RETURN_IF_ERROR(Verify(c, *hit));
    return hit;
  }
  for (const auto& [reader, chunk] : tls_decoding)
    if (reader == this && chunk == c)
      return ChunkError(StatusCode::kCorruption, c, "reads itself through its bases and refs (a cycle)");
  std::shared_ptr<InFlight> flight;
  bool leader = false;
  {
    std::lock_guard<std::mutex> lock(inflight_mu_);
    auto [it, inserted] = inflight_.try_emplace(c);
    if (inserted) it->second = std::make_shared<InFlight>();
    flight = it->second;
    leader = inserted;
  }
  if (!leader) {
    std::unique_lock<std::mutex> lock(flight->mu);
    const auto done = [&] { return flight->done; };
    if (depth == 0) {
      flight->cv.wait(lock, done);
    } else if (!flight->cv.wait_for(lock, kLinkedWait, done)) {
      // Decoded here, not cached (the leader will cache it).
      lock.unlock();
      std::shared_ptr<ChunkBuffer> own = cache_->AcquireBuffer(index_.chunks[c].logical_length);
      const DecodingMark mark(this, c);
      cache_->NoteDecode();
      RETURN_IF_ERROR(DecodeChunk(c, own->mutable_span(), depth));
      own->set_verified(depth == 0);
      return std::shared_ptr<const ChunkBuffer>(std::move(own));
    }
    if (!flight->status.ok()) return flight->status;
    if (depth == 0) RETURN_IF_ERROR(Verify(c, *flight->data));
    return flight->data;
  }
  Status status;
  std::shared_ptr<const ChunkBuffer> data = cache_->Get(*id_, c);  // a leader just before us
  if (data && depth == 0) status = Verify(c, *data);
  if (!data) {
    std::shared_ptr<ChunkBuffer> fresh = cache_->AcquireBuffer(index_.chunks[c].logical_length);
    const DecodingMark mark(this, c);
    if (!ReadSpilledChunk(c, fresh->mutable_span())) {
      cache_->NoteDecode();
      status = DecodeChunk(c, fresh->mutable_span(), depth);
      fresh->set_verified(depth == 0);
    }
    if (status.ok()) {
      data = fresh;
      const bool awaited = use == ChunkUse::kForStream && streams_.load(std::memory_order_relaxed) > 0 &&
                           finished_at_[c].load(std::memory_order_relaxed) == 0;
      cache_->Put(*id_, c, data, awaited);
    }
  }
  {
    std::lock_guard<std::mutex> lock(flight->mu);
    flight->done = true;
    flight->status = status;
    flight->data = data;
  }
  flight->cv.notify_all();
  {
    std::lock_guard<std::mutex> lock(inflight_mu_);
    inflight_.erase(c);
  }
  if (!status.ok()) return status;
  return data;
}

std::optional<ChunkSpill::View> BlobReaderImpl::SpilledChunkView(uint32_t c) const {
  ChunkSpill* spill = cache_->spill();
  if (spill == nullptr) return std::nullopt;
  const ChunkInfo& chunk = index_.chunks[c];
  std::optional<ChunkSpill::View> view = spill->ViewInMemory(*id_, chunk.logical_offset, chunk.logical_length);
  if (!view) return std::nullopt;
  // Checked as ReadSpilledChunk checks a copy.
  if (Checksum64(view->bytes) == chunk.checksum) return view;
  spill->Forget(*id_);
  return std::nullopt;
}

bool BlobReaderImpl::ReadSpilledChunk(uint32_t c, MutableByteSpan out) const {
  ChunkSpill* spill = cache_->spill();
  if (spill == nullptr || !spill->Read(*id_, index_.chunks[c].logical_offset, out)) return false;
  // A spill is a cache on a disk: bytes that are not the chunk's (a disk
  // error, a bug) are decoded instead, and the spill forgets the blob.
  if (Checksum64(out) == index_.chunks[c].checksum) return true;
  spill->Forget(*id_);
  return false;
}

Status BlobReaderImpl::Verify(uint32_t c, const ChunkBuffer& data) const {
  if (data.verified()) return Status::Ok();
  const uint64_t have = Checksum64(data.span());
  if (have != index_.chunks[c].checksum) {
    cache_->Drop(*id_, c);  // not kept for the next reader either
    return ChunkError(StatusCode::kChecksumMismatch, c,
                      fmt::format("decoded bytes checksum want={:016x} have={:016x} (decoded as an input first)",
                                  index_.chunks[c].checksum, have));
  }
  data.set_verified(true);
  return Status::Ok();
}

Status BlobReaderImpl::ChunkError(StatusCode code, uint32_t c, std::string_view why) const {
  std::string msg = fmt::format("blob{}{}: chunk {} at logical offset {}: {}", id_ ? " " : "",
                                id_ ? id_->Hex() : std::string(), c, index_.chunks[c].logical_offset, why);
  return code == StatusCode::kChecksumMismatch ? Status::ChecksumMismatch(std::move(msg))
                                               : Status::Corruption(std::move(msg));
}

Result<std::shared_ptr<const BlobReader>> BlobReaderImpl::OpenLink(Link link) const {
  std::lock_guard lock(base_mu_);
  std::shared_ptr<const BlobReader>& reader = link == Link::kBase ? base_reader_ : ref_reader_;
  if (reader) return reader;
  const char* what = link == Link::kBase ? "base" : "ref";
  const std::optional<ObjectId>& id = link == Link::kBase ? index_.header.base : index_.header.ref;
  if (!id) return Status::Corruption(fmt::format("blob: a chunk reads the {} but the blob names none", what));
  if (resolver_ == nullptr)
    return Status::NotFound(fmt::format("blob: {} {} needed but no resolver was given", what, id->Hex()));
  ASSIGN_OR_RETURN(reader, resolver_->OpenBlob(*id));
  if (reader == nullptr) return Status::Internal("blob: resolver returned no reader");
  return reader;
}

Status BlobReaderImpl::ReadPieces(uint64_t offset, uint64_t length, std::vector<Piece>* pieces) const {
  const uint64_t size = index_.header.logical_size;
  if (offset > size || length > size - offset)
    return Status::InvalidArgument(fmt::format("blob read: [{}, +{}) past the logical size {}", offset, length, size));
  if (length == 0) return Status::Ok();
  const auto& chunks = index_.chunks;
  uint32_t c = ChunkIndexAt(chunks, offset);
  const uint64_t end = offset + length;
  for (uint64_t at = offset; at < end; ++c) {
    const ChunkInfo& chunk = chunks[c];
    const uint64_t from = at - chunk.logical_offset;
    const uint64_t n = std::min(end, chunk.logical_offset + chunk.logical_length) - at;
    const bool cached = cache_ != nullptr && id_;
    std::shared_ptr<const ChunkBuffer> data;
    if (cached) {
      // Awaited until the reader has all of it: a reader may take a
      // chunk's last page first (torch.load reads the zip header after a
      // record, which shares that page) and the rest much later.
      ASSIGN_OR_RETURN(data, CachedChunk(c, 0, ChunkUse::kForStream));
    } else {
      auto fresh = std::make_shared<ChunkBuffer>();
      fresh->Resize(chunk.logical_length);
      RETURN_IF_ERROR(DecodeChunk(c, fresh->mutable_span(), 0));
      data = std::move(fresh);
    }
    ByteSpan piece(data->data() + from, n);
    pieces->push_back(Piece{std::move(data), piece});
    // A chunk later chunks read stays cached for them (in the LRU once
    // read), and they are decoded now, while it and its bases are cached.
    const std::span<const uint32_t> later = index_.LaterReaders(c);
    if (cached && !later.empty()) DecodeLaterReaders(later);
    if (cached && cache_->NoteRead(*id_, c, n, !later.empty())) MarkFinished(c);  // after the piece holds the buffer
    at += n;
  }
  return Status::Ok();
}

Status BlobReaderImpl::ReadAtDepth(uint64_t offset, MutableByteSpan out, uint32_t depth, ChunkUse use) const {
  const uint64_t size = index_.header.logical_size;
  if (offset > size || out.size() > size - offset)
    return Status::InvalidArgument(fmt::format("blob read: [{}, +{}) past the logical size {}", offset, out.size(), size));
  if (out.empty()) return Status::Ok();
  const auto& chunks = index_.chunks;
  uint32_t c = ChunkIndexAt(chunks, offset);
  uint64_t at = offset;
  const uint64_t end = offset + out.size();
  for (; at < end; ++c) {
    const ChunkInfo& chunk = chunks[c];
    const uint64_t from = at - chunk.logical_offset;
    const uint64_t n = std::min(end, chunk.logical_offset + chunk.logical_length) - at;
    MutableByteSpan target = out.subspan(at - offset, n);
    if (cache_ != nullptr && id_) {
      ASSIGN_OR_RETURN(std::shared_ptr<const ChunkBuffer> data, CachedChunk(c, depth, use));
      std::memcpy(target.data(), data->data() + from, n);
    } else if (n == chunk.logical_length) {
      RETURN_IF_ERROR(DecodeChunk(c, target, depth));  // the whole chunk: straight into `out`
    } else {
      CodecScratchPool::Lease scratch = scratch_->Acquire();
      std::byte* buffer = scratch->decoded.Reserve(chunk.logical_length);
      RETURN_IF_ERROR(DecodeChunk(c, MutableByteSpan(buffer, chunk.logical_length), depth));
      std::memcpy(target.data(), buffer + from, n);
    }
    at += n;
  }
  return Status::Ok();
}

Result<ByteSpan> BlobReaderImpl::ViewAtDepth(uint64_t offset, MutableByteSpan buffer, uint32_t depth,
                                             std::shared_ptr<const void>* hold, ChunkUse use) const {
  const uint64_t size = index_.header.logical_size;
  if (cache_ != nullptr && id_ && !buffer.empty() && offset <= size && buffer.size() <= size - offset) {
    const uint32_t c = ChunkIndexAt(index_.chunks, offset);
    const ChunkInfo& chunk = index_.chunks[c];
    const uint64_t from = offset - chunk.logical_offset;
    if (buffer.size() <= chunk.logical_length - from) {
      if (std::optional<ChunkSpill::View> spilled = SpilledChunkView(c)) {
        const std::byte* at = spilled->bytes.data() + from;
        if (reinterpret_cast<uintptr_t>(at) % 4 == 0) {
          *hold = std::move(spilled->owner);
          return ByteSpan(at, buffer.size());
        }
      }
      ASSIGN_OR_RETURN(std::shared_ptr<const ChunkBuffer> data, CachedChunk(c, depth, use));
      const std::byte* at = data->data() + from;
      if (reinterpret_cast<uintptr_t>(at) % 4 == 0) {
        *hold = std::move(data);
        return ByteSpan(at, buffer.size());
      }
    }
  }
  RETURN_IF_ERROR(ReadAtDepth(offset, buffer, depth, use));
  return ByteSpan(buffer);
}

}  // namespace blob_internal

Result<std::shared_ptr<const BlobReader>> BlobReader::Open(std::shared_ptr<const RandomAccessFile> blob,
                                                           std::optional<ObjectId> id, BlobResolver* resolver,
                                                           ChunkCache* cache, const DecodeLimits& limits) {
  if (blob == nullptr) return Status::InvalidArgument("blob open: no file");
  const uint64_t size = blob->Size();
  constexpr uint64_t kMinSize = BlobHeader::kEncodedSize + BlobFooter::kEncodedSize;
  if (size < kMinSize)
    return Status::Corruption(fmt::format("blob: {} bytes, want at least {}", size, kMinSize));
  std::array<std::byte, BlobHeader::kEncodedSize> header_bytes;
  RETURN_IF_ERROR(blob->ReadAt(0, header_bytes));
  ASSIGN_OR_RETURN(BlobHeader header, BlobHeader::DecodeFrom(header_bytes));
  std::array<std::byte, BlobFooter::kEncodedSize> footer_bytes;
  RETURN_IF_ERROR(blob->ReadAt(size - BlobFooter::kEncodedSize, footer_bytes));
  ASSIGN_OR_RETURN(BlobFooter footer, BlobFooter::DecodeFrom(footer_bytes));
  if (header.version != footer.version)
    return Status::Corruption(
        fmt::format("blob: header version {} and footer version {} differ", header.version, footer.version));
  // The index sits between the payloads and the footer, exactly.
  const uint64_t index_end = size - BlobFooter::kEncodedSize;
  if (footer.index_length > limits.max_index_bytes)
    return Status::Corruption(
        fmt::format("blob footer: index of {} bytes exceeds the limit {}", footer.index_length, limits.max_index_bytes));
  if (footer.index_offset < BlobHeader::kEncodedSize || footer.index_offset > index_end ||
      footer.index_length != index_end - footer.index_offset)
    return Status::Corruption(fmt::format("blob footer: index [{}, +{}), want it to end at {}", footer.index_offset,
                                          footer.index_length, index_end));
  std::vector<std::byte> stored_index(footer.index_length);
  RETURN_IF_ERROR(blob->ReadAt(footer.index_offset, stored_index));
  if (uint64_t have = Checksum64(stored_index); have != footer.index_checksum)
    return Status::ChecksumMismatch(
        fmt::format("blob index: checksum want={:016x} have={:016x}", footer.index_checksum, have));
  ASSIGN_OR_RETURN(std::vector<std::byte> index_bytes, IndexFromStored(footer, stored_index, limits.max_index_bytes));
  ASSIGN_OR_RETURN(BlobIndex index, BlobIndex::DecodeFrom(index_bytes, footer.index_offset, limits));
  if (id && index.header.base && *index.header.base == *id)
    return Status::Corruption(fmt::format("blob {}: names itself as its base", id->Hex()));
  if (id && index.header.ref && *index.header.ref == *id)
    return Status::Corruption(fmt::format("blob {}: names itself as its ref", id->Hex()));
  return std::shared_ptr<const BlobReader>(
      std::make_shared<blob_internal::BlobReaderImpl>(std::move(blob), id, resolver, cache, limits, std::move(index)));
}

}  // namespace ckptfs

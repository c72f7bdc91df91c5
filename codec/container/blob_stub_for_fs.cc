// TEMPORARY stand-in for the container so that fs/ runs end to end before the
// real codec/container lands; deleted at merge. Blob = header + per-chunk
// checksums + raw (or XOR-against-base when the base has the same size) bytes.
#include <fmt/format.h>

#include <cstring>
#include <mutex>

#include "codec/container/blob.h"

namespace ckptfs {
namespace {
constexpr char kMagic[8] = {'S', 'T', 'U', 'B', 'B', 'L', 'O', 'B'};
constexpr uint64_t kChunk = 1 << 20;
constexpr size_t kHeader = 8 + 8 + 1 + 16 + 8;  // magic, size, has_base, base, file checksum

class StubReader final : public BlobReader {
 public:
  uint64_t logical_size() const override { return size_; }
  uint64_t stored_size() const override { return file_->Size(); }
  FileFormat format() const override { return FileFormat::kOpaque; }
  const std::optional<ObjectId>& base() const override { return base_id_; }
  uint64_t file_checksum() const override { return file_sum_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const std::vector<SegmentInfo>& segments() const override { return segments_; }
  const std::vector<ChunkInfo>& chunks() const override { return chunks_; }
  Status ReadChunk(uint32_t i, std::vector<std::byte>* out) const {
    const ChunkInfo& c = chunks_[i];
    out->resize(c.logical_length);
    RETURN_IF_ERROR(file_->ReadAt(c.stored_offset, *out));
    if (base_id_) {
      std::shared_ptr<const BlobReader> base;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!base_) {
          if (resolver_ == nullptr) return Status::NotFound("stub blob: no resolver for base");
          ASSIGN_OR_RETURN(base_, resolver_->OpenBlob(*base_id_));
        }
        base = base_;
      }
      std::vector<std::byte> b(c.logical_length);
      RETURN_IF_ERROR(base->ReadAt(c.logical_offset, b));
      for (size_t k = 0; k < b.size(); ++k) (*out)[k] ^= b[k];
    }
    if (Checksum64(*out) != c.checksum)
      return Status::ChecksumMismatch(fmt::format("stub blob: chunk {} at offset {} fails its checksum", i,
                                                  c.logical_offset));
    return Status::Ok();
  }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override {
    if (offset > size_ || out.size() > size_ - offset) return Status::InvalidArgument("stub blob: read past end");
    std::vector<std::byte> buf;
    uint64_t done = 0;
    while (done < out.size()) {
      uint64_t pos = offset + done;
      uint32_t i = static_cast<uint32_t>(pos / kChunk);
      RETURN_IF_ERROR(ReadChunk(i, &buf));
      uint64_t in = pos - chunks_[i].logical_offset;
      uint64_t n = std::min<uint64_t>(buf.size() - in, out.size() - done);
      std::memcpy(out.data() + done, buf.data() + in, n);
      done += n;
    }
    return Status::Ok();
  }
  Status VerifyChunk(uint32_t index) const override {
    if (index >= chunks_.size()) return Status::InvalidArgument("stub blob: no such chunk");
    std::vector<std::byte> buf;
    return ReadChunk(index, &buf);
  }

  std::shared_ptr<const RandomAccessFile> file_;
  uint64_t size_ = 0, file_sum_ = 0;
  std::optional<ObjectId> base_id_;
  BlobResolver* resolver_ = nullptr;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const BlobReader> base_;
  std::vector<TensorInfo> tensors_;
  std::vector<SegmentInfo> segments_;
  std::vector<ChunkInfo> chunks_;
};
}  // namespace

std::string_view ChunkCodecName(ChunkCodec codec) { return codec == ChunkCodec::kRaw ? "raw" : "other"; }

Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout&, const BaseRef* base, const EncodeOptions&,
                               ByteSink* sink) {
  bool delta = base != nullptr && base->reader && base->reader->logical_size() == file.size() && !file.empty();
  std::vector<std::byte> head;
  ByteWriter w(&head);
  w.Bytes(AsBytes(std::string_view(kMagic, 8)));
  w.U64(file.size());
  w.U8(delta ? 1 : 0);
  w.Bytes(ByteSpan(reinterpret_cast<const std::byte*>(delta ? base->id.bytes.data() : ObjectId{}.bytes.data()), 16));
  w.U64(Checksum64(file));
  uint64_t n = (file.size() + kChunk - 1) / kChunk;
  for (uint64_t i = 0; i < n; ++i) w.U64(Checksum64(file.subspan(i * kChunk, std::min(kChunk, file.size() - i * kChunk))));
  RETURN_IF_ERROR(sink->Append(head));
  std::vector<std::byte> buf;
  for (uint64_t i = 0; i < n; ++i) {
    ByteSpan part = file.subspan(i * kChunk, std::min(kChunk, file.size() - i * kChunk));
    if (delta) {
      buf.resize(part.size());
      RETURN_IF_ERROR(base->reader->ReadAt(i * kChunk, buf));
      for (size_t k = 0; k < buf.size(); ++k) buf[k] ^= part[k];
      RETURN_IF_ERROR(sink->Append(buf));
    } else {
      RETURN_IF_ERROR(sink->Append(part));
    }
  }
  EncodeStats s;
  s.logical_bytes = file.size();
  s.stored_bytes = head.size() + file.size();
  s.chunks = static_cast<uint32_t>(n);
  s.delta_chunks = delta ? s.chunks : 0;
  s.uses_base = delta;
  return s;
}

Result<std::shared_ptr<const BlobReader>> BlobReader::Open(std::shared_ptr<const RandomAccessFile> blob,
                                                           std::optional<ObjectId>, BlobResolver* resolver,
                                                           ChunkCache*, const DecodeLimits&) {
  auto r = std::make_shared<StubReader>();
  std::vector<std::byte> head(kHeader);
  if (blob->Size() < kHeader) return Status::Corruption("stub blob: too short");
  RETURN_IF_ERROR(blob->ReadAt(0, head));
  if (std::memcmp(head.data(), kMagic, 8) != 0) return Status::Corruption("stub blob: bad magic");
  ByteReader rd(ByteSpan(head).subspan(8), "stub blob header");
  r->size_ = rd.U64();
  bool has_base = rd.U8() != 0;
  ObjectId id;
  std::memcpy(id.bytes.data(), rd.Bytes(16).data(), 16);
  if (has_base) r->base_id_ = id;
  r->file_sum_ = rd.U64();
  uint64_t n = (r->size_ + kChunk - 1) / kChunk;
  if (blob->Size() != kHeader + 8 * n + r->size_) return Status::Corruption("stub blob: size mismatch");
  std::vector<std::byte> sums(8 * n);
  RETURN_IF_ERROR(blob->ReadAt(kHeader, sums));
  for (uint64_t i = 0; i < n; ++i) {
    ChunkInfo c;
    c.logical_offset = i * kChunk;
    c.logical_length = std::min(kChunk, r->size_ - i * kChunk);
    c.stored_offset = kHeader + 8 * n + i * kChunk;
    c.stored_length = c.logical_length;
    c.checksum = LoadLE64(sums.data() + 8 * i);
    r->chunks_.push_back(c);
  }
  r->file_ = std::move(blob);
  r->resolver_ = resolver;
  return std::shared_ptr<const BlobReader>(std::move(r));
}

Result<std::vector<std::byte>> DecodeAll(const BlobReader& reader) {
  std::vector<std::byte> out(reader.logical_size());
  RETURN_IF_ERROR(reader.ReadAt(0, out));
  if (Checksum64(out) != reader.file_checksum()) return Status::ChecksumMismatch("stub blob: whole-file checksum");
  return out;
}

struct ChunkCache::Impl {};
ChunkCache::ChunkCache(uint64_t) : impl_(std::make_unique<Impl>()) {}
ChunkCache::~ChunkCache() = default;
std::shared_ptr<const std::vector<std::byte>> ChunkCache::Get(const ObjectId&, uint32_t) { return nullptr; }
void ChunkCache::Put(const ObjectId&, uint32_t, std::shared_ptr<const std::vector<std::byte>>) {}
uint64_t ChunkCache::size_bytes() const { return 0; }

}  // namespace ckptfs

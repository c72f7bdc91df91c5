// kRaw, kZstd and kZeros, and the zstd frame helpers the other codecs share.
#include <fmt/format.h>
#include <zstd.h>

#include <cstring>

#include "codec/tensor/codecs.h"

namespace ckptfs {

Result<size_t> ZstdCompressFrame(CodecScratch& scratch, int level, ByteSpan src, std::byte* dst,
                                 size_t capacity) {
  ZSTD_CCtx* cctx = scratch.cctx();
  // Reset parameters: a context may carry settings from another chunk.
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  size_t n = ZSTD_compress2(cctx, dst, capacity, src.data(), src.size());
  if (ZSTD_isError(n)) return Status::Internal(fmt::format("zstd compress: {}", ZSTD_getErrorName(n)));
  return n;
}

Status ZstdDecompressFrame(CodecScratch& scratch, ByteSpan src, MutableByteSpan out, std::string_view what) {
  unsigned long long content = ZSTD_getFrameContentSize(src.data(), src.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
    return Status::Corruption(fmt::format("{}: not a zstd frame with a declared content size", what));
  if (content != out.size())
    return Status::Corruption(
        fmt::format("{}: zstd frame declares {} bytes, want {}", what, content, out.size()));
  size_t frame = ZSTD_findFrameCompressedSize(src.data(), src.size());
  if (ZSTD_isError(frame) || frame != src.size())
    return Status::Corruption(fmt::format("{}: zstd frame is {} of {} stored bytes", what,
                                          ZSTD_isError(frame) ? 0 : frame, src.size()));
  size_t n = ZSTD_decompressDCtx(scratch.dctx(), out.data(), out.size(), src.data(), src.size());
  if (ZSTD_isError(n)) return Status::Corruption(fmt::format("{}: zstd: {}", what, ZSTD_getErrorName(n)));
  if (n != out.size())
    return Status::Corruption(fmt::format("{}: zstd produced {} bytes, want {}", what, n, out.size()));
  return Status::Ok();
}

Result<size_t> RawCodec::DoEncode(ByteSpan data, const ChunkContext&, CodecScratch&, std::byte* out) const {
  if (!data.empty()) std::memcpy(out, data.data(), data.size());
  return data.size();
}

Status RawCodec::DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch&, MutableByteSpan out) const {
  if (stored.size() != out.size())
    return Status::Corruption(fmt::format("raw: stored {} bytes, want {}", stored.size(), out.size()));
  if (!out.empty()) std::memcpy(out.data(), stored.data(), out.size());
  return Status::Ok();
}

size_t ZstdCodec::MaxEncodedSize(size_t raw_size, const ChunkContext&) const { return ZSTD_compressBound(raw_size); }

Result<size_t> ZstdCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                   std::byte* out) const {
  return ZstdCompressFrame(scratch, ctx.zstd_level, data, out, MaxEncodedSize(data.size(), ctx));
}

Status ZstdCodec::DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch& scratch, MutableByteSpan out) const {
  return ZstdDecompressFrame(scratch, stored, out, "zstd");
}

Result<size_t> ZerosCodec::DoEncode(ByteSpan data, const ChunkContext&, CodecScratch&, std::byte*) const {
  for (std::byte b : data)
    if (b != std::byte{0}) return Status::Unsupported("zeros: chunk has non-zero bytes");
  return size_t{0};
}

Status ZerosCodec::DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch&, MutableByteSpan out) const {
  if (!stored.empty())
    return Status::Corruption(fmt::format("zeros: stored {} bytes, want 0", stored.size()));
  if (!out.empty()) std::memset(out.data(), 0, out.size());
  return Status::Ok();
}

}  // namespace ckptfs

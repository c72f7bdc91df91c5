// kRaw, kZstd and kZeros, and the zstd frame helpers the other codecs share.
#include <fmt/format.h>
#include <zstd.h>

#include <cstring>

#include "codec/tensor/codecs.h"

namespace ckptfs {
namespace {
// zstd's largest window on 64-bit hosts (ZSTD_WINDOWLOG_MAX_64, which zstd.h
// defines only for static linking): a prefix and its chunk must fit in it.
constexpr int kMaxWindowLog = 31;
}  // namespace

Result<size_t> ZstdCompressFrame(CodecScratch& scratch, int level, ByteSpan src, std::byte* dst,
                                 size_t capacity, ByteSpan prefix) {
  ZSTD_CCtx* cctx = scratch.cctx();
  // Reset parameters: a context may carry settings from another chunk.
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  if (!prefix.empty()) {
    // The window must reach back over the whole prefix.
    int log = 10;
    while (log < kMaxWindowLog && (size_t{1} << log) < prefix.size() + src.size()) ++log;
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, log);
    const size_t r = ZSTD_CCtx_refPrefix(cctx, prefix.data(), prefix.size());
    if (ZSTD_isError(r)) return Status::Internal(fmt::format("zstd prefix: {}", ZSTD_getErrorName(r)));
  }
  size_t n = ZSTD_compress2(cctx, dst, capacity, src.data(), src.size());
  if (ZSTD_isError(n)) return Status::Internal(fmt::format("zstd compress: {}", ZSTD_getErrorName(n)));
  return n;
}

Status ZstdDecompressFrame(CodecScratch& scratch, ByteSpan src, MutableByteSpan out, std::string_view what,
                           ByteSpan prefix) {
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
  ZSTD_DCtx* dctx = scratch.dctx();
  if (!prefix.empty()) {
    // Used for this frame only (zstd forgets a prefix at the frame's end).
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters);
    ZSTD_DCtx_setParameter(dctx, ZSTD_d_windowLogMax, kMaxWindowLog);
    const size_t r = ZSTD_DCtx_refPrefix(dctx, prefix.data(), prefix.size());
    if (ZSTD_isError(r)) return Status::Internal(fmt::format("{}: zstd prefix: {}", what, ZSTD_getErrorName(r)));
  }
  size_t n = ZSTD_decompressDCtx(dctx, out.data(), out.size(), src.data(), src.size());
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

size_t ZstdWithBaseCodec::MaxEncodedSize(size_t raw_size, const ChunkContext&) const {
  return ZSTD_compressBound(raw_size);
}

Result<size_t> ZstdWithBaseCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                           std::byte* out) const {
  if (ctx.base.size() != data.size()) return Status::InvalidArgument("zstd-base: base length differs from the chunk's");
  return ZstdCompressFrame(scratch, ctx.zstd_level, data, out, MaxEncodedSize(data.size(), ctx), ctx.base);
}

Status ZstdWithBaseCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                   MutableByteSpan out) const {
  if (ctx.base.size() != out.size())
    return Status::Corruption(fmt::format("zstd-base: base of {} bytes, want {}", ctx.base.size(), out.size()));
  return ZstdDecompressFrame(scratch, stored, out, "zstd-base", ctx.base);
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

#include "codec/tensor/chunk_codec.h"

#include <fmt/format.h>

#include "codec/tensor/codecs.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {

Result<size_t> ChunkCodecImpl::Encode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                      ScratchBuffer* out) const {
  if (!Accepts(ctx.dtype, !ctx.base.empty()))
    return Status::InvalidArgument(fmt::format("{}: cannot encode dtype {}{}", ChunkCodecName(id_),
                                               DTypeName(ctx.dtype), ctx.base.empty() ? "" : " with a base"));
  if (!ctx.base.empty() && ctx.base.size() != data.size())
    return Status::InvalidArgument(
        fmt::format("{}: base is {} bytes, want {}", ChunkCodecName(id_), ctx.base.size(), data.size()));
  const size_t bound = MaxEncodedSize(data.size(), ctx);
  ASSIGN_OR_RETURN(size_t n, DoEncode(data, ctx, scratch, out->Reserve(bound)));
  if (n > bound)
    return Status::Internal(fmt::format("{}: wrote {} bytes past its bound {}", ChunkCodecName(id_), n, bound));
  return n;
}

Status ChunkCodecImpl::Decode(ByteSpan stored, ByteSpan params, const ChunkContext& ctx, CodecScratch& scratch,
                              MutableByteSpan out, std::optional<uint64_t>* checksum) const {
  if (!TakesParams() && !params.empty())
    return Status::Corruption(
        fmt::format("{}: parameters area holds {} bytes, want 0", ChunkCodecName(id_), params.size()));
  if (!ctx.base.empty() && ctx.base.size() != out.size())
    return Status::Internal(
        fmt::format("{}: base is {} bytes, want {}", ChunkCodecName(id_), ctx.base.size(), out.size()));
  if (checksum != nullptr) {
    checksum->reset();
    return DoDecodeAndHash(stored, ctx, scratch, out, checksum);
  }
  return DoDecode(stored, ctx, scratch, out);
}

const ChunkCodecImpl* FindChunkCodec(ChunkCodec id) {
  static const RawCodec raw;
  static const ZstdCodec zstd;
  static const BytePlaneCodec byte_plane;
  static const BytePlaneXorCodec byte_plane_xor;
  static const ZerosCodec zeros;
  static const ZstdWithBaseCodec zstd_with_base;
  static const LossyChunkCodec lossy;
  switch (id) {
    case ChunkCodec::kRaw: return &raw;
    case ChunkCodec::kZstd: return &zstd;
    case ChunkCodec::kBytePlaneZstd: return &byte_plane;
    case ChunkCodec::kBytePlaneXorZstd: return &byte_plane_xor;
    case ChunkCodec::kZeros: return &zeros;
    case ChunkCodec::kZstdWithBase: return &zstd_with_base;
    case ChunkCodec::kLossy: return &lossy;
  }
  return nullptr;
}

}  // namespace ckptfs

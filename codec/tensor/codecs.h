// The lossless chunk codecs (internal to codec/tensor; use FindChunkCodec).
#pragma once

#include "codec/tensor/chunk_codec.h"

namespace ckptfs {

// One zstd frame of `src` at `level` into dst[0, capacity); returns its size.
// With a non-empty `prefix` the frame refers to it (a raw-content
// dictionary: matches may reach back into it), and decoding needs it too.
Result<size_t> ZstdCompressFrame(CodecScratch& scratch, int level, ByteSpan src, std::byte* dst,
                                 size_t capacity, ByteSpan prefix = {});
// Decodes `src`, which must be exactly one zstd frame declaring out.size()
// bytes of content (checked before decompressing: no bomb gets to inflate),
// with the `prefix` it was compressed with.
Status ZstdDecompressFrame(CodecScratch& scratch, ByteSpan src, MutableByteSpan out, std::string_view what,
                           ByteSpan prefix = {});

// kRaw: the bytes as they are.
class RawCodec final : public ChunkCodecImpl {
 public:
  RawCodec() : ChunkCodecImpl(ChunkCodec::kRaw) {}
  bool Accepts(DType, bool has_base) const override { return !has_base; }

 protected:
  size_t MaxEncodedSize(size_t raw_size, const ChunkContext&) const override { return raw_size; }
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext&, CodecScratch&, std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch&, MutableByteSpan out) const override;
};

// kZstd: one zstd frame of the bytes.
class ZstdCodec final : public ChunkCodecImpl {
 public:
  ZstdCodec() : ChunkCodecImpl(ChunkCodec::kZstd) {}
  bool Accepts(DType, bool has_base) const override { return !has_base; }

 protected:
  size_t MaxEncodedSize(size_t raw_size, const ChunkContext&) const override;
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                          std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch& scratch, MutableByteSpan out) const override;
};

// kZstdWithBase: one zstd frame of the bytes whose prefix is the base
// version's bytes of the same range. For what byte planes do not suit
// (verbatim bytes, integer tensors): a pickle or an RNG state that changed
// little or not at all since the base costs a few bytes instead of a key
// frame.
class ZstdWithBaseCodec final : public ChunkCodecImpl {
 public:
  ZstdWithBaseCodec() : ChunkCodecImpl(ChunkCodec::kZstdWithBase) {}
  bool Accepts(DType, bool has_base) const override { return has_base; }

 protected:
  size_t MaxEncodedSize(size_t raw_size, const ChunkContext&) const override;
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                          std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch, MutableByteSpan out) const override;
};

// kZeros: all-zero bytes; nothing is stored.
class ZerosCodec final : public ChunkCodecImpl {
 public:
  ZerosCodec() : ChunkCodecImpl(ChunkCodec::kZeros) {}
  bool Accepts(DType, bool has_base) const override { return !has_base; }

 protected:
  size_t MaxEncodedSize(size_t, const ChunkContext&) const override { return 0; }
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext&, CodecScratch&, std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext&, CodecScratch&, MutableByteSpan out) const override;
};

// kBytePlaneZstd: f32/f16/bf16 split into byte planes, each stored raw,
// as one repeated byte, or as a zstd frame (see FORMAT.md, "Byte-plane
// payload").
class BytePlaneCodec : public ChunkCodecImpl {
 public:
  BytePlaneCodec() : ChunkCodecImpl(ChunkCodec::kBytePlaneZstd) {}
  bool Accepts(DType dtype, bool has_base) const override { return !has_base && IsCodecFloat(dtype); }

 protected:
  explicit BytePlaneCodec(ChunkCodec id) : ChunkCodecImpl(id) {}
  size_t MaxEncodedSize(size_t raw_size, const ChunkContext& ctx) const override;
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                          std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                  MutableByteSpan out) const override;
  // The streamed float path (one rANS plane, the others raw) hashes each
  // block as it is merged.
  Status DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch, MutableByteSpan out,
                         std::optional<uint64_t>* checksum) const override;
};

// kBytePlaneXorZstd: XOR with the base version's bytes, then as
// kBytePlaneZstd. Unchanged elements become zero bytes.
class BytePlaneXorCodec final : public BytePlaneCodec {
 public:
  BytePlaneXorCodec() : BytePlaneCodec(ChunkCodec::kBytePlaneXorZstd) {}
  bool Accepts(DType dtype, bool has_base) const override { return has_base && IsCodecFloat(dtype); }

 protected:
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                          std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                  MutableByteSpan out) const override;
  // The streamed path XORs and hashes each block as it is merged.
  Status DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch, MutableByteSpan out,
                         std::optional<uint64_t>* checksum) const override;
};

}  // namespace ckptfs

// Chunk codecs: each turns one chunk of a file (a run of whole elements of
// one tensor, or verbatim bytes) into stored bytes and back. The public,
// non-virtual Encode/Decode own the checks common to every codec (output
// bounds, exact decoded size, the parameters area); codecs implement
// DoEncode/DoDecode/MaxEncodedSize. Codecs are looked up by their ChunkCodec
// id, the number stored in blobs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy/base_slices.h"
#include "codec/tensor/rans_context.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// What a codec knows about a chunk besides its bytes.
struct ChunkContext {
  DType dtype = DType::kU8;  // element type; verbatim bytes are kU8
  int zstd_level = 3;        // encode only
  // Delta codecs: the base version's bytes of the same tensor range, as
  // long as the chunk. Empty for key-frame codecs.
  ByteSpan base;
  // Decode only: the symbol contexts a lossy chunk was encoded with (a
  // dithered first moment's, codec/tensor/lossy/dither.h); empty: none.
  ByteContexts symbol_contexts;
  // Decode only, lossy: a base made on demand instead of `base` (which is
  // then empty), read a slice at a time where the decoder can; and a last
  // step on each decoded slice (lossy::DecodeChunk).
  const lossy::BaseSlices* base_slices = nullptr;
  const lossy::SliceFinish* finish = nullptr;
};

// Thread safety: codecs are immutable; Encode/Decode may run concurrently
// with distinct scratch objects.
class ChunkCodecImpl {
 public:
  explicit ChunkCodecImpl(ChunkCodec id) : id_(id) {}
  virtual ~ChunkCodecImpl() = default;

  ChunkCodec id() const { return id_; }

  // True if this codec can encode a chunk of `dtype` (with or without a
  // base version).
  virtual bool Accepts(DType dtype, bool has_base) const = 0;

  // Encodes `data` into `out`; returns the stored size (bytes at out->data()).
  // Unsupported when the codec does not apply to this data (e.g. kZeros for
  // non-zero bytes). REQUIRES: Accepts(ctx.dtype, !ctx.base.empty()); data is
  // whole elements of ctx.dtype; ctx.base is empty or data.size() long.
  Result<size_t> Encode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                        ScratchBuffer* out) const;

  // Decodes `stored` into exactly out.size() bytes. `params` is the chunk's
  // parameters area (empty for every lossless codec: anything else is
  // Corruption). Hostile input gives Corruption, never UB.
  // REQUIRES: ctx.base is empty or out.size() long.
  // With `checksum`, a codec that can hashes the output as it writes it,
  // piece by piece while the bytes are in cache, and sets *checksum to
  // XXH3-64 of all of `out` (Checksum64, the chunk's decoded checksum);
  // the others leave it empty, and the caller hashes `out` itself.
  Status Decode(ByteSpan stored, ByteSpan params, const ChunkContext& ctx, CodecScratch& scratch,
                MutableByteSpan out, std::optional<uint64_t>* checksum = nullptr) const;

 protected:
  // An upper bound of the stored size for `raw_size` input bytes.
  virtual size_t MaxEncodedSize(size_t raw_size, const ChunkContext& ctx) const = 0;
  // Writes at most MaxEncodedSize bytes to `out`; returns how many.
  virtual Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                  std::byte* out) const = 0;
  // Fills all of `out`, or fails.
  virtual Status DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                          MutableByteSpan out) const = 0;
  // DoDecode that may also hash its output as it goes (Decode with a
  // checksum); by default it does not.
  virtual Status DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                 MutableByteSpan out, std::optional<uint64_t>* /*checksum*/) const {
    return DoDecode(stored, ctx, scratch, out);
  }
  // True for codecs that store parameters (the lossy ones, later).
  virtual bool TakesParams() const { return false; }

 private:
  ChunkCodec id_;
};

// The codec for `id`, or nullptr if this build does not know it.
// Thread safety: safe; the registry is immutable.
const ChunkCodecImpl* FindChunkCodec(ChunkCodec id);

// True if `id` is a codec this build can decode.
inline bool IsKnownChunkCodec(uint8_t id) { return FindChunkCodec(static_cast<ChunkCodec>(id)) != nullptr; }

}  // namespace ckptfs

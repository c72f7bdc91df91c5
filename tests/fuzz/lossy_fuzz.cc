// libFuzzer target: DecodeChunk on arbitrary bytes must return a status and
// never crash or read out of bounds. The input's first byte picks the element
// type, delta frame and output size; the rest is the stream body, to which
// the correct checksum trailer is appended so that the parser behind the
// checksum is exercised (a random trailer would almost never match).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/tensor/lossy/dither.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/stream.h"

namespace {

// A base handed out slice by slice, and a last step on each decoded slice
// (the blob reader's row-column base and step space): the decoders' slice
// paths must be as safe as their whole-chunk ones.
class FilledSlices final : public ckptfs::lossy::BaseSlices, public ckptfs::lossy::SliceFinish {
 public:
  explicit FilledSlices(uint64_t elements) : elements_(elements) {}
  uint64_t elements() const override { return elements_; }
  void Fill(uint64_t first, uint64_t count, std::byte* out) const override {
    for (uint64_t i = 0; i < count; ++i) ckptfs::StoreLE32(out + 4 * i, static_cast<uint32_t>(0x3f000000u + first + i));
  }
  void Apply(uint64_t, uint64_t count, std::byte* slice) const override {
    for (uint64_t i = 0; i < count; ++i) slice[4 * i + 3] ^= std::byte{0x01};
  }

 private:
  uint64_t elements_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  using namespace ckptfs::lossy;
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const ElementType type = static_cast<ElementType>(1 + control % 3);
  const bool delta = (control & 0x04) != 0;
  ByteSpan body(reinterpret_cast<const std::byte*>(data + 1), size - 1);

  // Output size: the element count the header claims when it is modest,
  // else a small fixed size (both paths must be safe).
  uint64_t n = 0;
  if (Result<StreamHeader> h = StreamHeader::DecodeFrom(body); h.ok()) n = h->element_count;
  if (n > (1u << 16) || (control & 0x08)) n = control >> 4;
  const size_t bytes = n * ElementSize(type);

  std::vector<std::byte> stream(body.begin(), body.end());
  ByteWriter(&stream).U64(Checksum64(body));
  std::vector<std::byte> base(delta ? bytes : 0, std::byte{0x3c});
  std::vector<std::byte> out(bytes);
  Scratch scratch;
  (void)DecodeChunk(type, stream, base, out, &scratch);
  (void)DecodeChunk(type, ByteSpan(reinterpret_cast<const std::byte*>(data), size), base, out, &scratch);
  // The sliced path (write, patch and hash slice by slice), as the blob
  // reader decodes; up to 2^16 elements reach several slices.
  std::optional<uint64_t> checksum;
  (void)DecodeChunk(type, stream, base, out, &scratch, nullptr, &checksum);
  // Stream version 4 codes its symbols in contexts (a dithered chunk's).
  std::vector<uint8_t> ids(n);
  std::vector<std::byte> zeros(4 * n);
  (void)SubtractDither(1.0, control, zeros, ids.data());
  (void)DecodeChunk(type, stream, base, out, &scratch, nullptr, &checksum, ByteContexts{ids.data(), kDitherContexts});
  // An f32 chunk's base in slices and a finish on each slice (other types
  // are refused with a status).
  const FilledSlices slices(n);
  (void)DecodeChunk(type, stream, {}, out, &scratch, nullptr, &checksum, {}, &slices, &slices);
  (void)DecodeChunk(type, stream, {}, out, &scratch, nullptr, nullptr, {}, delta ? &slices : nullptr, &slices);
  return 0;
}

// kBytePlaneZstd and kBytePlaneXorZstd. Payload (FORMAT.md, "Byte-plane
// payload"): u8 width (bit 7: sparse), then per plane {u8 mode, u32 LE
// stored length}, then the planes' stored bytes in plane order; a sparse
// payload has the zero-element mask as an extra first plane.
#include <fmt/format.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "codec/common/hash.h"
#include "codec/tensor/byte_planes.h"
#include "codec/tensor/codecs.h"
#include "codec/tensor/element_ranges.h"
#include "codec/tensor/rans.h"
#include "codec/tensor/rans_model.h"
#include "codec/tensor/rans_stream.h"
#include "codec/tensor/zero_elements.h"

namespace ckptfs {
namespace {

// How one plane is stored. Stored in blobs: never renumber.
enum class PlaneMode : uint8_t {
  kRaw = 0,       // the plane's bytes as they are
  kZstd = 1,      // one zstd frame
  kConstant = 2,  // one byte, repeated for every element
  kRans = 3,      // a static order-0 rANS stream (rans.h)
};

constexpr size_t kMaxWidth = 4;
constexpr size_t kPlaneEntrySize = 5;
// The first payload byte is the plane count; with this bit set the payload
// is sparse: a zero-element mask comes first and the planes hold only the
// non-zero elements.
constexpr uint8_t kSparseFlag = 0x80;
size_t HeaderSize(size_t entries) { return 1 + kPlaneEntrySize * entries; }
size_t MaskBytes(size_t count) { return (count + 7) / 8; }

// A chunk with at least this share of all-zero elements is stored sparse.
// Trained Adam states hold 5-15% exact zeros (parameters whose gradient
// was always zero); a zero inflates the order-0 statistics of every plane,
// while the mask costs about the binary entropy of the share (0.2 bits per
// element at 3%) and lets the low mantissa planes of the rest go raw. XOR
// residuals of barely changed tensors are mostly zero elements.
constexpr size_t kSparseMinZeroShareInverse = 32;

// The chunk's statistics come from every kElementSampleStride-th element:
// which planes are stored raw (their bytes can then be split straight into
// the payload). ~33800 samples per 4 MiB f32 chunk estimate a plane's
// entropy within a few hundredths of a bit (a uniform plane reads about
// 0.006 bits low). Prime: like values often sit in columns, which a
// power-of-two stride would hit or miss whole.
constexpr size_t kElementSampleStride = 31;
// The zero mask and the samples come from one pass over the chunk, in
// blocks of this many elements (whole mask bytes, whole strides) that are
// still in L1 when they are sampled; the strided reads alone would touch
// every other cache line.
constexpr size_t kScanBlock = 16 * kElementSampleStride;
// The scan is the chunk's first read and waits on memory with the hardware
// prefetcher alone (bf16: ~13% of encoding, ~5% with this): it asks for
// the block this many elements ahead while it works on one.
constexpr size_t kScanAhead = 8 * kScanBlock;
// Planes of a chunk whose element sample holds no non-zero element (a
// sparse chunk of nearly only zeros) are sampled themselves, every
// kPlaneSampleStride-th byte.
constexpr size_t kPlaneSampleStride = 32;

// A plane whose sampled byte entropy is above this many bits per byte is
// stored raw: rANS would save under 1.3% of it for a full coding pass (the
// high mantissa byte of trained f32 sits at ~7.96, the low ones at 7.99-8.0;
// on the benchmark checkpoint's f32 tensors 7.9 instead of 7.97 costs 0.1%
// of the ratio and saves a second coding pass per chunk).
constexpr double kRawEntropyBits = 7.9;
// Planes below this entropy (long zero runs: XOR residuals of barely
// changed tensors) get zstd at the caller's level, where LZ matches pay;
// the others are order-0 data and get rANS, which is faster than zstd's
// Huffman literals and closer to the entropy.
constexpr double kMatchingEntropyBits = 1.0;

struct PlaneStats {
  double entropy_bits = 0;
  size_t samples = 0;
  bool maybe_constant = false;  // every sample the same byte
  bool from_elements = false;   // `hist` (and `ranges`, if set) come from the chunk's scan
  ByteHistogram hist{};
  std::optional<rans::ByteRanges> ranges;
};

PlaneStats StatsOf(const ByteHistogram& hist) {
  PlaneStats stats;
  stats.hist = hist;
  for (uint32_t c : hist) stats.samples += c;
  double h = 0;
  int distinct = 0;
  for (uint32_t c : hist) {
    if (c == 0) continue;
    ++distinct;
    double q = static_cast<double>(c) / static_cast<double>(stats.samples);
    h -= q * std::log2(q);
  }
  stats.entropy_bits = h;
  stats.maybe_constant = distinct == 1;
  return stats;
}

PlaneStats SamplePlane(const uint8_t* p, size_t n) {
  std::array<uint32_t, 256> hist{};
  for (size_t i = 0; i < n; i += kPlaneSampleStride) ++hist[p[i]];
  return StatsOf(hist);
}

// Byte histograms of every kElementSampleStride-th element by plane; the
// all-zero ones are only counted. Alternate samples go to two sets of
// tables: the common values (an exponent byte) would otherwise serialise
// every increment on one counter (store-to-load forwarding).
struct ElementSample {
  std::array<std::array<std::array<uint32_t, 256>, kMaxWidth>, 2> hist{};
  size_t zeros = 0;

  // Plane k's histogram.
  std::array<uint32_t, 256> Plane(size_t k) const {
    std::array<uint32_t, 256> h;
    for (size_t v = 0; v < 256; ++v) h[v] = hist[0][k][v] + hist[1][k][v];
    return h;
  }
};

// Adds the samples of in[0, count) (elements 0, kElementSampleStride, ...)
// to `sample`. Byte k of an element is plane k's, whatever the byte order.
void SampleElements(const std::byte* in, size_t count, size_t width, ElementSample* sample) {
  const auto* p = reinterpret_cast<const uint8_t*>(in);
  size_t zeros = 0;
  for (size_t i = 0, n = 0; i < count; i += kElementSampleStride, ++n) {
    auto& h = sample->hist[n & 1];
    const uint8_t* e = p + i * width;
    if (width == 4) {
      const bool zero = (e[0] | e[1] | e[2] | e[3]) == 0;
      zeros += zero;
      if (zero) continue;
      ++h[0][e[0]];
      ++h[1][e[1]];
      ++h[2][e[2]];
      ++h[3][e[3]];
    } else {
      const bool zero = (e[0] | e[1]) == 0;
      zeros += zero;
      if (zero) continue;
      ++h[0][e[0]];
      ++h[1][e[1]];
    }
  }
  sample->zeros += zeros;
}

// The zero mask of in[0, count), the samples and, with `ranges`, the
// planes' byte ranges; returns the number of zero elements.
size_t ScanElements(const std::byte* in, size_t count, size_t width, std::byte* mask, ElementSample* sample,
                    ElementByteRanges* ranges) {
  size_t zeros = 0;
  const size_t bytes = count * width;
  for (size_t b = 0; b < count; b += kScanBlock) {
    const size_t n = std::min(kScanBlock, count - b);
    for (size_t at = (b + kScanAhead) * width; at < std::min(bytes, (b + kScanAhead + n) * width); at += 64)
      __builtin_prefetch(in + at);
    zeros += ZeroElementMask(in + b * width, n, width, mask + b / 8);
    SampleElements(in + b * width, n, width, sample);
    if (ranges != nullptr) ranges->Add(in + b * width, n);
  }
  return zeros;
}

// Stores one plane of `count` bytes at `out` (room for `count` bytes);
// returns its mode and stored length.
std::pair<PlaneMode, size_t> EncodePlane(const std::byte* plane_bytes, size_t count, PlaneStats stats, int level,
                                         CodecScratch& scratch, std::byte* out) {
  if (count == 0) return {PlaneMode::kRaw, 0};
  const auto* plane = reinterpret_cast<const uint8_t*>(plane_bytes);
  if (stats.samples == 0) stats = SamplePlane(plane, count);
  if (stats.maybe_constant && std::all_of(plane, plane + count, [&](uint8_t b) { return b == plane[0]; })) {
    out[0] = plane_bytes[0];
    return {PlaneMode::kConstant, 1};
  }
  if (stats.entropy_bits < kRawEntropyBits) {
    // Capacity one byte short of raw: either coder fails unless it saves space.
    if (stats.entropy_bits < kMatchingEntropyBits) {
      Result<size_t> z = ZstdCompressFrame(scratch, level, ByteSpan(plane_bytes, count), out, count - 1);
      if (z.ok()) return {PlaneMode::kZstd, *z};
    } else {
      // The element sample, when there is one, is the model's sample.
      const ByteHistogram model =
          !stats.from_elements ? ModelBytes(plane, count)
          : stats.ranges       ? ModelBytesFromSample(plane, count, stats.hist, *stats.ranges)
                               : ModelBytesFromSample(plane, count, stats.hist, rans::FindByteRanges(plane, count));
      Result<size_t> r = RansEncode(plane, count, model, out, count - 1);
      if (r.ok()) return {PlaneMode::kRans, *r};
    }
  }
  std::memcpy(out, plane_bytes, count);
  return {PlaneMode::kRaw, count};
}

// Zero elements come in runs (a parameter row whose gradient is always
// zero), so the mask is LZ data: zstd level 1 stores the benchmark's masks
// in a quarter to a half of what order-0 rANS needs, at the same speed.
constexpr int kMaskZstdLevel = 1;

std::pair<PlaneMode, size_t> EncodeMask(const std::byte* mask, size_t count, CodecScratch& scratch, std::byte* out) {
  if (count > 1) {
    Result<size_t> z = ZstdCompressFrame(scratch, kMaskZstdLevel, ByteSpan(mask, count), out, count - 1);
    if (z.ok()) return {PlaneMode::kZstd, *z};
  }
  std::memcpy(out, mask, count);
  return {PlaneMode::kRaw, count};
}

void SetEntry(std::byte* out, size_t k, PlaneMode mode, size_t stored) {
  std::byte* entry = out + 1 + kPlaneEntrySize * k;
  entry[0] = std::byte(static_cast<uint8_t>(mode));
  StoreLE32(entry + 1, static_cast<uint32_t>(stored));
}

// Decodes one stored plane to `count` bytes; returns where they are (in
// `target`, or in `data` itself for a raw plane).
Result<const std::byte*> DecodePlane(uint8_t mode, ByteSpan data, size_t count, std::byte* target,
                                     CodecScratch& scratch, std::string_view what, size_t k) {
  switch (static_cast<PlaneMode>(mode)) {
    case PlaneMode::kRaw:
      if (data.size() != count)
        return Status::Corruption(fmt::format("{}: raw plane {} is {} bytes, want {}", what, k, data.size(), count));
      return data.data();
    case PlaneMode::kConstant:
      if (data.size() != 1)
        return Status::Corruption(fmt::format("{}: constant plane {} is {} bytes, want 1", what, k, data.size()));
      std::memset(target, static_cast<int>(data[0]), count);
      return static_cast<const std::byte*>(target);
    case PlaneMode::kZstd:
      RETURN_IF_ERROR(ZstdDecompressFrame(scratch, data, MutableByteSpan(target, count),
                                          fmt::format("{}: plane {}", what, k)));
      return static_cast<const std::byte*>(target);
    case PlaneMode::kRans:
      RETURN_IF_ERROR(RansDecode(data, reinterpret_cast<uint8_t*>(target), count, fmt::format("{}: plane {}", what, k)));
      return static_cast<const std::byte*>(target);
  }
  return Status::Corruption(fmt::format("{}: plane {} has unknown mode {}", what, k, mode));
}

// The number of set bits in p[0, n). Word-wide bit counting: std::popcount
// becomes a library call per byte without -mpopcnt.
size_t CountSetBits(const std::byte* p, size_t n) {
  size_t bits = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    std::memcpy(&x, p + i, 8);
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    bits += static_cast<size_t>((x * 0x0101010101010101ull) >> 56);
  }
  for (; i < n; ++i) bits += static_cast<size_t>(std::popcount(static_cast<uint8_t>(p[i])));
  return bits;
}

// The streamed decode works on blocks of this many elements. The rANS
// decoder is bound by the latency of its two state vectors (table gather,
// multiply) and leaves most execution ports idle; with small blocks the
// merge and the zero expansion of one block (independent of the rANS
// states) run in those ports while the next block decodes, and every
// step's data stays in L1. On the benchmark checkpoint's bf16 tensors 256-
// 512 elements decode ~35% faster than decoding each plane whole and then
// merging and expanding (8192: ~5%).
constexpr size_t kStreamBlock = 512;
constexpr size_t kCacheLine = 64;

// The plane that DecodeStreamed takes from a rANS stream: the one kRans
// plane when every other plane is raw (the usual float chunk: sign and
// exponent byte coded, mantissa bytes raw); else `width`, for the
// plane-by-plane path.
size_t StreamedRansPlane(const uint8_t* modes, size_t width) {
  size_t rans_plane = width;
  for (size_t k = 0; k < width; ++k) {
    if (static_cast<PlaneMode>(modes[k]) == PlaneMode::kRans && rans_plane == width) rans_plane = k;
    else if (static_cast<PlaneMode>(modes[k]) != PlaneMode::kRaw) return width;
  }
  return rans_plane;
}

// What happens to each block of decoded output once it is merged, while it
// is in cache: XOR with the base version (a delta chunk), then the chunk
// checksum, fed in pieces of about kHashPiece bytes.
class BlockFinisher {
 public:
  // `base`: empty, or out.size() bytes. `hash`: nullptr for none.
  BlockFinisher(MutableByteSpan out, ByteSpan base, Checksum64Stream* hash) : out_(out), base_(base), hash_(hash) {}
  // Bytes [at, at + n) of `out` are final but for the XOR; blocks come in order.
  void Done(size_t at, size_t n) {
    if (!base_.empty()) XorBytes(out_.data() + at, base_.data() + at, n, out_.data() + at);
    if (hash_ == nullptr) return;
    if (at + n - hashed_ >= kHashPiece || at + n == out_.size()) {
      hash_->Update(ByteSpan(out_.data() + hashed_, at + n - hashed_));
      hashed_ = at + n;
    }
  }

 private:
  static constexpr size_t kHashPiece = 16 << 10;
  MutableByteSpan out_;
  ByteSpan base_;
  Checksum64Stream* hash_;
  size_t hashed_ = 0;
};

// Decodes planes bodies[0, width) of `kept` elements each, all raw but
// bodies[rans_plane], into `out` (count elements), block by block; with a
// mask (sparse payload) the zero elements go back in as each block is
// merged. `finish` sees each block once it is written. `first_plane`
// numbers the planes in messages.
Status DecodeStreamed(const ByteSpan* bodies, size_t rans_plane, size_t first_plane, size_t width, size_t count,
                      size_t kept, const std::byte* mask, CodecScratch& scratch, MutableByteSpan out,
                      BlockFinisher& finish, std::string_view what) {
  for (size_t k = 0; k < width; ++k) {
    if (k != rans_plane && bodies[k].size() != kept)
      return Status::Corruption(fmt::format("{}: raw plane {} is {} bytes, want {}", what, first_plane + k,
                                            bodies[k].size(), kept));
  }
  RansStreamDecoder rans;
  RETURN_IF_ERROR(rans.Open(bodies[rans_plane], kept, fmt::format("{}: plane {}", what, first_plane + rans_plane)));
  // A piece of the rANS plane is at most a block plus the rest of a group.
  constexpr size_t kPieceRoom = kStreamBlock + 2 * rans::kStates;
  auto* coded = reinterpret_cast<uint8_t*>(scratch.planes.Reserve(kPieceRoom));
  std::array<const std::byte*, kMaxWidth> planes{};
  // Merges the kept elements [from, from + n) to `to`. The rANS steps are
  // arithmetic: while they run, the next piece's raw bytes come in.
  auto merge = [&](size_t from, size_t n, std::byte* to) -> Status {
    const size_t ahead = std::min(kept, from + n + kStreamBlock);
    for (size_t k = 0; k < width; ++k) {
      if (k == rans_plane) continue;
      for (size_t at = from + n; at < ahead; at += kCacheLine) __builtin_prefetch(bodies[k].data() + at);
    }
    RETURN_IF_ERROR(rans.Next(coded, n));
    for (size_t k = 0; k < width; ++k)
      planes[k] = k == rans_plane ? reinterpret_cast<const std::byte*>(coded) : bodies[k].data() + from;
    MergeBytePlanes(planes.data(), n, width, to);
    return Status::Ok();
  };
  if (mask == nullptr) {
    for (size_t i = 0; i < count; i += kStreamBlock) {
      const size_t n = std::min(kStreamBlock, count - i);
      RETURN_IF_ERROR(merge(i, n, out.data() + i * width));
      finish.Done(i * width, n * width);
    }
    return rans.Finish();
  }
  // `packed` holds the merged kept elements [taken, merged): fewer than a
  // group past the blocks put back so far, plus the next block's.
  std::byte* packed = scratch.packed.Reserve(width * kPieceRoom);
  size_t taken = 0, merged = 0;
  for (size_t i = 0; i < count; i += kStreamBlock) {
    const size_t n = std::min(kStreamBlock, count - i);
    const size_t block_kept = n - CountSetBits(mask + i / 8, MaskBytes(n));
    if (merged < taken + block_kept) {
      // Up to a group boundary, so that the next piece starts on one and
      // takes the vector path.
      const size_t to = std::min((taken + block_kept + rans::kStates - 1) / rans::kStates * rans::kStates, kept);
      RETURN_IF_ERROR(merge(merged, to - merged, packed + (merged - taken) * width));
      merged = to;
    }
    // Unpacking reads up to n elements from `packed`: within kPieceRoom.
    UnpackNonZeroElements(packed, mask + i / 8, n, width, out.data() + i * width);
    finish.Done(i * width, n * width);
    taken += block_kept;
    std::memmove(packed, packed + block_kept * width, (merged - taken) * width);
  }
  return rans.Finish();
}

// Decodes the payload `stored` of a chunk of out.size() bytes into `out`,
// XORed with `base` when that is not empty (a delta chunk). With `checksum`,
// the streamed path also hashes the output as it goes and sets *checksum.
Status DecodePlanes(ByteSpan stored, DType dtype, ByteSpan base, CodecScratch& scratch, MutableByteSpan out,
                    std::optional<uint64_t>* checksum, std::string_view what) {
  const size_t width = DTypeSize(dtype);
  if (!IsCodecFloat(dtype) || (width != 2 && width != 4))
    return Status::Corruption(fmt::format("{}: dtype {} is not a byte-plane float", what, DTypeName(dtype)));
  if (out.size() % width != 0)
    return Status::Corruption(fmt::format("{}: {} bytes is not a whole number of {}-byte elements", what,
                                          out.size(), width));
  const size_t count = out.size() / width;
  ByteReader header(stored, what);
  const uint8_t first = header.U8();
  const bool sparse = (first & kSparseFlag) != 0;
  const uint8_t stored_width = first & static_cast<uint8_t>(~kSparseFlag);
  if (header.ok() && stored_width != width)
    return Status::Corruption(fmt::format("{}: plane count want={} have={}", what, width, stored_width));
  const size_t entries = width + (sparse ? 1 : 0);
  std::array<uint8_t, kMaxWidth + 1> modes{};
  std::array<uint32_t, kMaxWidth + 1> lengths{};
  for (size_t k = 0; k < entries; ++k) {
    modes[k] = header.U8();
    lengths[k] = header.U32();
  }
  RETURN_IF_ERROR(header.status());
  std::array<ByteSpan, kMaxWidth + 1> bodies{};
  for (size_t k = 0; k < entries; ++k) {
    bodies[k] = header.Bytes(lengths[k]);
    if (!header.ok())
      return Status::Corruption(fmt::format("{}: plane {} declares {} bytes, {} remain", what, k, lengths[k],
                                            header.remaining()));
  }
  if (header.remaining() != 0)
    return Status::Corruption(fmt::format("{}: {} bytes after the last plane", what, header.remaining()));

  // A sparse payload's first entry is the zero-element mask; the planes
  // then hold only the non-zero elements.
  size_t kept = count;
  const std::byte* mask = nullptr;
  if (sparse) {
    const size_t mask_bytes = MaskBytes(count);
    std::byte* target = scratch.zero_mask.Reserve(mask_bytes);
    ASSIGN_OR_RETURN(mask, DecodePlane(modes[0], bodies[0], mask_bytes, target, scratch, what, 0));
    const size_t zeros = CountSetBits(mask, mask_bytes);
    if (count % 8 != 0 && (static_cast<uint8_t>(mask[mask_bytes - 1]) >> (count % 8)) != 0)
      return Status::Corruption(fmt::format("{}: zero mask has bits past the last element", what));
    kept = count - zeros;
  }
  const size_t first_plane = sparse ? 1 : 0;
  if (const size_t rans_plane = StreamedRansPlane(modes.data() + first_plane, width); rans_plane < width) {
    std::optional<Checksum64Stream> hash;
    if (checksum != nullptr) hash.emplace();
    BlockFinisher finish(out, base, hash ? &*hash : nullptr);
    RETURN_IF_ERROR(DecodeStreamed(bodies.data() + first_plane, rans_plane, first_plane, width, count, kept, mask,
                                   scratch, out, finish, what));
    if (hash) *checksum = hash->Digest();
    return Status::Ok();
  }
  std::byte* buffer = scratch.planes.Reserve(width * kept);
  std::array<const std::byte*, kMaxWidth> planes{};
  for (size_t k = 0; k < width; ++k) {
    ASSIGN_OR_RETURN(planes[k], DecodePlane(modes[first_plane + k], bodies[first_plane + k], kept,
                                            buffer + k * kept, scratch, what, first_plane + k));
  }
  if (!sparse) {
    MergeBytePlanes(planes.data(), count, width, out.data());
  } else {
    // Unpacking may read one element past the kept ones: room for count.
    std::byte* packed = scratch.packed.Reserve(width * count);
    MergeBytePlanes(planes.data(), kept, width, packed);
    UnpackNonZeroElements(packed, mask, count, width, out.data());
  }
  if (!base.empty()) XorBytes(out.data(), base.data(), out.size(), out.data());
  return Status::Ok();
}

// Writes the payload of the chunk `data` to `out`. The zero mask and the
// coded planes' stored bytes are only known after coding, so the raw planes
// that come before any coded one are split straight to their place in
// `out`; the others go through scratch.planes.
Result<size_t> SplitAndEncode(ByteSpan data, DType dtype, int level, CodecScratch& scratch, std::byte* out) {
  const size_t width = DTypeSize(dtype);
  const size_t count = data.size() / width;
  const std::byte* elements = data.data();
  std::byte* mask = scratch.zero_mask.Reserve(MaskBytes(count));
  ElementSample sample;
  // The scan finds the byte ranges of every plane, at a cost that grows
  // with the planes it does not need them for: 2-byte elements (one of two
  // planes coded) gain, 4-byte ones (one of four) lose; those read the
  // coded planes for them instead.
  std::optional<ElementByteRanges> ranges;
  if (width == 2) ranges.emplace(width);
  const size_t zeros = ScanElements(elements, count, width, mask, &sample, ranges ? &*ranges : nullptr);
  // All-zero chunks (unchanged tensors' residuals) are smaller as constant planes.
  const bool sparse = zeros < count && zeros * kSparseMinZeroShareInverse >= count;
  const size_t kept = sparse ? count - zeros : count;
  const size_t first_plane = sparse ? 1 : 0;
  out[0] = std::byte(static_cast<uint8_t>(width) | (sparse ? kSparseFlag : 0));
  size_t at = HeaderSize(first_plane + width);
  if (sparse) {
    auto [mode, stored] = EncodeMask(mask, MaskBytes(count), scratch, out + at);
    SetEntry(out, 0, mode, stored);
    at += stored;
  }

  std::array<PlaneStats, kMaxWidth> stats{};
  std::array<std::byte*, kMaxWidth> planes{};
  size_t in_place = 0;  // planes [0, in_place) are split into `out` as they are stored
  std::byte* buffer = scratch.planes.Reserve(width * kept);
  for (size_t k = 0; k < width; ++k) {
    std::array<uint32_t, 256> hist = sample.Plane(k);
    if (!sparse) hist[0] += static_cast<uint32_t>(sample.zeros);
    stats[k] = StatsOf(hist);
    stats[k].from_elements = true;
    if (ranges) stats[k].ranges = ranges->Plane(k, !sparse && zeros != 0);
    const bool raw = kept == 0 || (stats[k].samples != 0 && stats[k].entropy_bits >= kRawEntropyBits);
    if (raw && in_place == k) {
      planes[k] = out + at + k * kept;
      ++in_place;
    } else {
      planes[k] = buffer + k * kept;
    }
  }
  if (sparse) SplitNonZeroElements(elements, count, width, mask, kept, planes.data());
  else SplitBytePlanes(elements, count, width, planes.data());

  for (size_t k = 0; k < width; ++k) {
    auto [mode, stored] = k < in_place ? std::pair{PlaneMode::kRaw, kept}
                                       : EncodePlane(planes[k], kept, stats[k], level, scratch, out + at);
    SetEntry(out, first_plane + k, mode, stored);
    at += stored;
  }
  return at;
}

}  // namespace

size_t BytePlaneCodec::MaxEncodedSize(size_t raw_size, const ChunkContext& ctx) const {
  // The sparse form adds one entry and the mask and drops at least
  // count / kSparseMinZeroShareInverse elements; plainly bounded by both.
  const size_t width = DTypeSize(ctx.dtype);
  return HeaderSize(width + 1) + raw_size + MaskBytes(raw_size / width);
}

Result<size_t> BytePlaneCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                        std::byte* out) const {
  return SplitAndEncode(data, ctx.dtype, ctx.zstd_level, scratch, out);
}

Status BytePlaneCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                MutableByteSpan out) const {
  return DecodePlanes(stored, ctx.dtype, {}, scratch, out, nullptr, "byte-plane");
}

Status BytePlaneCodec::DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                       MutableByteSpan out, std::optional<uint64_t>* checksum) const {
  return DecodePlanes(stored, ctx.dtype, {}, scratch, out, checksum, "byte-plane");
}

Result<size_t> BytePlaneXorCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                           std::byte* out) const {
  std::byte* residual = scratch.xored.Reserve(data.size());
  XorBytes(data.data(), ctx.base.data(), data.size(), residual);
  return SplitAndEncode(ByteSpan(residual, data.size()), ctx.dtype, ctx.zstd_level, scratch, out);
}

Status BytePlaneXorCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                   MutableByteSpan out) const {
  return DoDecodeAndHash(stored, ctx, scratch, out, nullptr);
}

Status BytePlaneXorCodec::DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                          MutableByteSpan out, std::optional<uint64_t>* checksum) const {
  if (ctx.base.size() != out.size())
    return Status::Internal(fmt::format("byte-plane-xor: base is {} bytes, want {}", ctx.base.size(), out.size()));
  return DecodePlanes(stored, ctx.dtype, ctx.base, scratch, out, checksum, "byte-plane-xor");
}

}  // namespace ckptfs

#include "codec/common/hash.h"

#include <libdeflate.h>

// Inline XXH3 instead of calling the shared library: three hash passes per
// chunk sit on the hot encode and read paths.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <new>

#include "codec/common/hash_avx2.h"
#include "codec/common/simd_level.h"

namespace ckptfs {

namespace {
// Checksums of whole 4 MiB chunks are a good part of a cold read's CPU time;
// the AVX2 build of XXH3 hashes about twice as fast as the baseline x86-64
// (SSE2) one and gives the same values. Checked once per process.
bool UseAvx2() {
#if defined(__x86_64__) && !defined(__AVX2__)
  return BestSimdLevel() != SimdLevel::kScalar;
#else
  return false;  // not x86-64, or the baseline build already uses AVX2
#endif
}
// Below this the vector width does not matter (XXH3's short-input paths).
constexpr size_t kAvx2MinBytes = 1024;
}  // namespace

uint64_t Checksum64(ByteSpan data) {
  if (data.size() >= kAvx2MinBytes && UseAvx2()) return hash_avx2::Xxh3_64(data.data(), data.size());
  return XXH3_64bits(data.data(), data.size());
}

Xxh3State::Xxh3State() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
}
Xxh3State::~Xxh3State() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

Checksum64Stream::Checksum64Stream() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_.get())); }
void Checksum64Stream::Update(ByteSpan data) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_.get()), data.data(), data.size());
}
uint64_t Checksum64Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_.get()));
}

uint32_t Crc32(ByteSpan data, uint32_t crc) { return libdeflate_crc32(crc, data.data(), data.size()); }

namespace {
ObjectId FromXxh128(XXH128_hash_t h) {
  ObjectId id;
  for (int i = 0; i < 8; ++i) {
    id.bytes[i] = static_cast<uint8_t>(h.high64 >> (56 - 8 * i));
    id.bytes[8 + i] = static_cast<uint8_t>(h.low64 >> (56 - 8 * i));
  }
  return id;
}
}  // namespace

ObjectId ObjectId::Of(ByteSpan content) {
  if (content.size() >= kAvx2MinBytes && UseAvx2()) {
    XXH128_hash_t h;
    hash_avx2::Xxh3_128(content.data(), content.size(), &h.high64, &h.low64);
    return FromXxh128(h);
  }
  return FromXxh128(XXH3_128bits(content.data(), content.size()));
}

ObjectIdStream::ObjectIdStream() { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_.get())); }
void ObjectIdStream::Update(ByteSpan data) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_.get()), data.data(), data.size());
}
ObjectId ObjectIdStream::Digest() const {
  return FromXxh128(XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_.get())));
}

Result<ObjectId> ObjectId::FromHex(std::string_view hex) {
  if (hex.size() != 32) return Status::InvalidArgument("object id: want 32 hex digits have " + std::to_string(hex.size()));
  ObjectId id;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else return Status::InvalidArgument("object id: not a lowercase hex digit in '" + std::string(hex) + "'");
    id.bytes[i / 2] = static_cast<uint8_t>(id.bytes[i / 2] | (i % 2 == 0 ? v << 4 : v));
  }
  return id;
}

std::string ObjectId::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

bool ObjectId::IsZero() const {
  for (uint8_t b : bytes)
    if (b != 0) return false;
  return true;
}

}  // namespace ckptfs

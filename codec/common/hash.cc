#include "codec/common/hash.h"

#include <libdeflate.h>

// Inline XXH3 instead of calling the shared library: three hash passes per
// chunk sit on the hot encode and read paths.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <new>

#include "codec/common/hash_wide.h"
#include "codec/common/simd_level.h"

namespace ckptfs {

namespace {

// The XXH3 entry points of one vector width. Checksums of whole 4 MiB chunks
// are a good part of an encode's and a cold read's CPU time; the AVX2 build
// of XXH3 hashes about twice as fast as the baseline x86-64 (SSE2) one, the
// AVX-512 build faster again, and all give the same values.
struct Xxh3Kernels {
  uint64_t (*hash64)(const void*, size_t);
  void (*hash128)(const void*, size_t, uint64_t*, uint64_t*);
  void (*update64)(void*, const void*, size_t);
  uint64_t (*digest64)(const void*);
  void (*update128)(void*, const void*, size_t);
  void (*digest128)(const void*, uint64_t*, uint64_t*);
};

void BaselineHash128(const void* data, size_t size, uint64_t* high64, uint64_t* low64) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  *high64 = h.high64;
  *low64 = h.low64;
}
void BaselineUpdate64(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t BaselineDigest64(const void* state) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state)); }
void BaselineUpdate128(void* state, const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
void BaselineDigest128(const void* state, uint64_t* high64, uint64_t* low64) {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state));
  *high64 = h.high64;
  *low64 = h.low64;
}

Xxh3Kernels KernelsFor(SimdLevel level) {
#if defined(__x86_64__)
  if (level == SimdLevel::kAvx512)
    return {hash_avx512::Xxh3_64,       hash_avx512::Xxh3_128,       hash_avx512::Xxh3_64Update,
            hash_avx512::Xxh3_64Digest, hash_avx512::Xxh3_128Update, hash_avx512::Xxh3_128Digest};
  if (level == SimdLevel::kAvx2)
    return {hash_avx2::Xxh3_64,       hash_avx2::Xxh3_128,       hash_avx2::Xxh3_64Update,
            hash_avx2::Xxh3_64Digest, hash_avx2::Xxh3_128Update, hash_avx2::Xxh3_128Digest};
#else
  (void)level;
#endif
  return {XXH3_64bits, BaselineHash128, BaselineUpdate64, BaselineDigest64, BaselineUpdate128, BaselineDigest128};
}

// Chosen once per process (immutable afterwards).
const Xxh3Kernels& Kernels() {
  static const Xxh3Kernels kernels = KernelsFor(BestSimdLevel());
  return kernels;
}

// Below this the vector width does not matter (XXH3's short-input paths).
constexpr size_t kWideMinBytes = 1024;

}  // namespace

uint64_t Checksum64(ByteSpan data) {
  if (data.size() < kWideMinBytes) return XXH3_64bits(data.data(), data.size());
  return Kernels().hash64(data.data(), data.size());
}

Xxh3State::Xxh3State() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
}
Xxh3State::~Xxh3State() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

Checksum64Stream::Checksum64Stream() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_.get())); }
void Checksum64Stream::Update(ByteSpan data) { Kernels().update64(state_.get(), data.data(), data.size()); }
uint64_t Checksum64Stream::Digest() const { return Kernels().digest64(state_.get()); }

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
  if (content.size() < kWideMinBytes) return FromXxh128(XXH3_128bits(content.data(), content.size()));
  XXH128_hash_t h;
  Kernels().hash128(content.data(), content.size(), &h.high64, &h.low64);
  return FromXxh128(h);
}

ObjectIdStream::ObjectIdStream() { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_.get())); }
void ObjectIdStream::Update(ByteSpan data) { Kernels().update128(state_.get(), data.data(), data.size()); }
ObjectId ObjectIdStream::Digest() const {
  XXH128_hash_t h;
  Kernels().digest128(state_.get(), &h.high64, &h.low64);
  return FromXxh128(h);
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

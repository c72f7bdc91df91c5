// Checksums and content addresses.
//  - Checksum64: XXH3-64 (seed 0), the per-chunk and whole-file checksum.
//  - ObjectId:   XXH3-128 (seed 0) of an object's bytes, its content address.
//  - Crc32:      the zip CRC-32 (IEEE 802.3, reflected, as in zlib).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "codec/common/bytes.h"

namespace ckptfs {

uint64_t Checksum64(ByteSpan data);

// Incremental XXH3-64 over several spans; same value as Checksum64 of their
// concatenation. Not thread-safe.
class Checksum64Stream {
 public:
  Checksum64Stream();
  ~Checksum64Stream();
  Checksum64Stream(const Checksum64Stream&) = delete;
  Checksum64Stream& operator=(const Checksum64Stream&) = delete;
  void Update(ByteSpan data);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*, kept opaque so xxhash.h stays private
};

uint32_t Crc32(ByteSpan data, uint32_t crc = 0);

struct ObjectId;

// Incremental XXH3-128 over several spans; Digest() equals ObjectId::Of of
// their concatenation (hashing a large object without mapping it whole).
// Not thread-safe.
class ObjectIdStream {
 public:
  ObjectIdStream();
  ~ObjectIdStream();
  ObjectIdStream(const ObjectIdStream&) = delete;
  ObjectIdStream& operator=(const ObjectIdStream&) = delete;
  void Update(ByteSpan data);
  ObjectId Digest() const;

 private:
  void* state_;  // XXH3_state_t*
};

// 16-byte content address of an immutable object. Hex form: 32 lowercase
// hex digits, high half first.
struct ObjectId {
  std::array<uint8_t, 16> bytes{};

  static ObjectId Of(ByteSpan content);
  // InvalidArgument unless `hex` is exactly 32 lowercase hex digits (this
  // is what keeps a manifest from naming a path outside the store).
  static Result<ObjectId> FromHex(std::string_view hex);
  std::string Hex() const;
  bool IsZero() const;
  friend bool operator==(const ObjectId&, const ObjectId&) = default;
  friend auto operator<=>(const ObjectId&, const ObjectId&) = default;
};

struct ObjectIdHash {
  size_t operator()(const ObjectId& id) const {
    size_t h;
    std::memcpy(&h, id.bytes.data(), sizeof h);
    return h;
  }
};

}  // namespace ckptfs

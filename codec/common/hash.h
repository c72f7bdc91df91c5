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

// One XXH3 streaming state, owned; the two streams below hold one each.
// Kept opaque so that xxhash.h stays private to hash.cc.
class Xxh3State {
 public:
  Xxh3State();  // throws std::bad_alloc
  ~Xxh3State();
  Xxh3State(const Xxh3State&) = delete;
  Xxh3State& operator=(const Xxh3State&) = delete;
  void* get() const { return state_; }  // XXH3_state_t*

 private:
  void* state_;
};

// Incremental XXH3-64 over several spans; same value as Checksum64 of their
// concatenation. Not thread-safe.
class Checksum64Stream {
 public:
  Checksum64Stream();
  void Update(ByteSpan data);
  uint64_t Digest() const;

 private:
  Xxh3State state_;
};

uint32_t Crc32(ByteSpan data, uint32_t crc = 0);

struct ObjectId;

// Incremental XXH3-128 over several spans; Digest() equals ObjectId::Of of
// their concatenation (hashing a large object without mapping it whole).
// Not thread-safe.
class ObjectIdStream {
 public:
  ObjectIdStream();
  void Update(ByteSpan data);
  ObjectId Digest() const;

 private:
  Xxh3State state_;
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

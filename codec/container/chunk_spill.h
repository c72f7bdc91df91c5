// A second place a ChunkCache's readers look for a decoded chunk before
// they decode it: whole reconstructions of blobs kept outside the cache's
// memory (the daemon keeps those of the versions it just wrote,
// fs/reconstruction_spill.h, so that the next version's encode and reads
// on the same node need not decode the chain again). What a spill returns
// is checked against the chunk's checksum before it is used.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"

namespace ckptfs {

class ChunkSpill {
 public:
  virtual ~ChunkSpill() = default;
  // Fills `out` with the bytes of `blob`'s reconstruction at `offset`;
  // false when the spill holds no such range or cannot read it.
  // Thread-safe.
  virtual bool Read(const ObjectId& blob, uint64_t offset, MutableByteSpan out) = 0;
  // The bytes of `blob`'s reconstruction at [offset, +length) where the
  // spill has them in memory: `bytes` stays valid while `owner` is held
  // (after the spill let go of them too). nullopt when they are not in its
  // memory (on its disk, or not held): Read then copies them. Readers use
  // a view in place, without copying the chunk twice (into a chunk
  // buffer, then where they want it). Thread-safe.
  struct View {
    std::shared_ptr<const void> owner;
    ByteSpan bytes;
  };
  virtual std::optional<View> ViewInMemory(const ObjectId& blob, uint64_t offset, uint64_t length) {
    (void)blob, (void)offset, (void)length;
    return std::nullopt;
  }
  // What Read gave for `blob` was not the chunk's (its checksum says so):
  // the spill lets go of `blob`, so that later misses decode instead of
  // reading and checking the bad bytes again. Thread-safe.
  virtual void Forget(const ObjectId& blob) = 0;
};

}  // namespace ckptfs

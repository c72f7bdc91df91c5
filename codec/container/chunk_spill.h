// A second place a ChunkCache's readers look for a decoded chunk before
// they decode it: whole reconstructions of blobs kept outside the cache's
// memory (the daemon keeps those of the versions it just wrote,
// fs/reconstruction_spill.h, so that the next version's encode and reads
// on the same node need not decode the chain again). What a spill returns
// is checked against the chunk's checksum before it is used.
#pragma once

#include <cstdint>

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
  // What Read gave for `blob` was not the chunk's (its checksum says so):
  // the spill lets go of `blob`, so that later misses decode instead of
  // reading and checking the bad bytes again. Thread-safe.
  virtual void Forget(const ObjectId& blob) = 0;
};

}  // namespace ckptfs

// ChunkCache: an LRU list plus a hash map from (blob, chunk) to list nodes,
// under one mutex (lookups are short; decoding happens outside the lock).
#include <list>
#include <mutex>
#include <unordered_map>

#include "codec/container/blob.h"
#include "codec/tensor/scratch_pool.h"

namespace ckptfs {

namespace {
struct CacheKey {
  ObjectId blob;
  uint32_t chunk = 0;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const { return ObjectIdHash{}(k.blob) * 31 + k.chunk; }
};
}  // namespace

struct ChunkCache::Impl {
  struct Entry {
    CacheKey key;
    std::shared_ptr<const std::vector<std::byte>> data;
  };
  uint64_t capacity = 0;
  // Enough idle scratches for a few reads in parallel, each following a
  // delta chain a few levels deep (one scratch per level).
  CodecScratchPool scratch{12};
  mutable std::mutex mu;  // guards everything below
  uint64_t bytes = 0;
  std::list<Entry> lru;  // front = most recently used
  std::unordered_map<CacheKey, std::list<Entry>::iterator, CacheKeyHash> map;

  // Evicted buffers that had no other owner, for AcquireBuffer. Bounded by
  // count: a few cover the decodes in flight of a sequential reader.
  std::vector<std::shared_ptr<std::vector<std::byte>>> spare;

  // Unlinks `it` from the map and the list, keeping its buffer as a spare
  // when that is possible.
  void Remove(std::list<Entry>::iterator it) {
    bytes -= it->data->size();
    map.erase(it->key);
    // use_count() == 1: no reader holds it, and none can get it now that
    // it left the map. Every cached buffer was created non-const, so the
    // const_pointer_cast is sound.
    if (it->data.use_count() == 1 && spare.size() < kMaxSpareBuffers)
      spare.push_back(std::const_pointer_cast<std::vector<std::byte>>(std::move(it->data)));
    lru.erase(it);
  }
  void EvictToFit() {
    while (bytes > capacity && !lru.empty()) Remove(std::prev(lru.end()));
  }
  static constexpr size_t kMaxSpareBuffers = 8;
};

ChunkCache::ChunkCache(uint64_t capacity_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->capacity = capacity_bytes;
}
ChunkCache::~ChunkCache() = default;

std::shared_ptr<const std::vector<std::byte>> ChunkCache::Get(const ObjectId& blob, uint32_t chunk) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->map.find(CacheKey{blob, chunk});
  if (it == impl_->map.end()) return nullptr;
  impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
  return it->second->data;
}

void ChunkCache::Put(const ObjectId& blob, uint32_t chunk, std::shared_ptr<const std::vector<std::byte>> data) {
  if (data == nullptr) return;
  std::lock_guard lock(impl_->mu);
  // An entry larger than the whole cache would only evict everything else.
  if (data->size() > impl_->capacity) return;
  CacheKey key{blob, chunk};
  auto it = impl_->map.find(key);
  if (it != impl_->map.end()) {
    impl_->bytes -= it->second->data->size();
    impl_->lru.erase(it->second);
    impl_->map.erase(it);
  }
  impl_->bytes += data->size();
  impl_->lru.push_front(Impl::Entry{key, std::move(data)});
  impl_->map.emplace(key, impl_->lru.begin());
  impl_->EvictToFit();
}

std::shared_ptr<std::vector<std::byte>> ChunkCache::AcquireBuffer(size_t size) {
  std::shared_ptr<std::vector<std::byte>> buffer;
  {
    std::lock_guard lock(impl_->mu);
    if (!impl_->spare.empty()) {
      buffer = std::move(impl_->spare.back());
      impl_->spare.pop_back();
    }
  }
  if (!buffer) buffer = std::make_shared<std::vector<std::byte>>();
  // Chunks are nearly all the same size: resize rarely touches new memory.
  buffer->resize(size);
  return buffer;
}

void ChunkCache::Drop(const ObjectId& blob, uint32_t chunk) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->map.find(CacheKey{blob, chunk});
  if (it != impl_->map.end()) impl_->Remove(it->second);
}

CodecScratchPool& ChunkCache::scratch_pool() { return impl_->scratch; }

uint64_t ChunkCache::size_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->bytes;
}

}  // namespace ckptfs

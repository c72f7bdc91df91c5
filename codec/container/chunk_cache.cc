// ChunkCache: an LRU list plus a hash map from (blob, chunk) to list nodes,
// under one mutex (lookups are short; decoding happens outside the lock),
// and an idle list of chunk buffers that every buffer returns to when its
// last holder lets go.
#include <atomic>
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

// Buffers nobody holds, for reuse. Shared by the cache and every buffer it
// lent (a buffer may outlive the cache: a reply still being written).
class IdleBuffers {
 public:
  IdleBuffers(uint64_t capacity, uint64_t reserve) : capacity_(capacity), reserve_(reserve) {}

  // An idle buffer of at least `size` bytes and at most twice that (the
  // most recently returned, whose memory is the warmest), else null. The
  // cache counts a chunk's size, not its buffer's: a 4 MiB buffer lent to
  // a bias of 8 KiB would hold 4 MiB that nothing counts (without this
  // rule, after a cold read of a 957 MB checkpoint the cache counted 264 MB
  // of chunks while its buffers, with 2 scratches, held 747 MB).
  std::unique_ptr<ChunkBuffer> Take(size_t size) {
    std::lock_guard lock(mu_);
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
      if ((*it)->capacity() < size || (*it)->capacity() / 2 > size) continue;
      std::unique_ptr<ChunkBuffer> b = std::move(*it);
      idle_.erase(std::next(it).base());
      bytes_ -= b->capacity();
      return b;
    }
    return nullptr;
  }

  // Keeps `buffer` while idle plus cached bytes fit the capacity (with the
  // extra room, below), or the idle bytes the reserve; frees it otherwise
  // (or once the cache is gone).
  void GiveBack(std::unique_ptr<ChunkBuffer> buffer) {
    std::unique_ptr<ChunkBuffer> freed;
    std::lock_guard lock(mu_);
    const uint64_t idle_after = bytes_ + buffer->capacity();
    if (!closed_ && (idle_after + cached_bytes_ <= capacity_ + extra_ || idle_after <= reserve_)) {
      bytes_ += buffer->capacity();
      idle_.push_back(std::move(buffer));
    } else {
      freed = std::move(buffer);  // freed after the lock is released (declared first)
    }
  }

  // The cache now holds `cached` bytes, and idle buffers may take `extra`
  // bytes beyond the capacity: frees idle buffers until idle plus cached
  // bytes fit again, or the idle ones the reserve.
  void SetCached(uint64_t cached, uint64_t extra) {
    std::vector<std::unique_ptr<ChunkBuffer>> freed;
    std::lock_guard lock(mu_);
    cached_bytes_ = cached;
    extra_ = extra;
    while (!idle_.empty() && bytes_ + cached > capacity_ + extra && bytes_ > reserve_) {
      bytes_ -= idle_.front()->capacity();
      freed.push_back(std::move(idle_.front()));
      idle_.erase(idle_.begin());
    }
  }

  // The cache is going away: buffers returned from now on are freed.
  void Close() {
    std::vector<std::unique_ptr<ChunkBuffer>> freed;
    std::lock_guard lock(mu_);
    closed_ = true;
    freed.swap(idle_);
    bytes_ = 0;
  }

  uint64_t bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
  }

 private:
  const uint64_t capacity_;
  const uint64_t reserve_;  // idle bytes kept whatever the cache holds
  mutable std::mutex mu_;  // leaf lock; guards the members below
  std::vector<std::unique_ptr<ChunkBuffer>> idle_;
  uint64_t bytes_ = 0;  // capacity of the buffers in idle_
  bool closed_ = false;
  uint64_t cached_bytes_ = 0;  // what the cache holds, as SetCached last said
  uint64_t extra_ = 0;         // room beyond the capacity, as SetCached last said
};

// Idle decode scratches kept while no reader streams a blob (a small read
// now and then needs no more).
constexpr size_t kScratchesBetweenStreams = 2;

// The deleter of lent buffers: back to the idle list.
struct ReturnToIdle {
  std::shared_ptr<IdleBuffers> idle;
  void operator()(ChunkBuffer* buffer) const { idle->GiveBack(std::unique_ptr<ChunkBuffer>(buffer)); }
};

}  // namespace

struct ChunkCache::Impl {
  struct Entry {
    CacheKey key;
    std::shared_ptr<const ChunkBuffer> data;
    uint64_t read = 0;  // bytes NoteRead counted
    bool awaited = false;  // in `awaited`, not in `lru`
  };
  uint64_t capacity = 0;
  uint64_t awaited_capacity = 0;
  std::shared_ptr<IdleBuffers> idle;
  // The memory of the chunk buffers under 4 MiB (8 MiB blocks), at most
  // what the cache holds with its idle buffers (made by the constructor).
  std::shared_ptr<ChunkArena> arena;
  // Enough idle scratches for a few reads in parallel, each following a
  // delta chain a few levels deep (one scratch per level), while a stream
  // is open; kScratchesBetweenStreams once none is.
  CodecScratchPool scratch{12};
  std::atomic<ChunkSpill*> spill{nullptr};
  std::atomic<uint64_t> decodes{0};
  // Lock order: mu before the idle list's lock (a buffer let go under mu
  // returns to the idle list).
  mutable std::mutex mu;  // guards everything below
  uint64_t bytes = 0;          // of the entries in `lru`
  uint64_t awaited_bytes = 0;  // of the entries in `awaited`
  int streams = 0;             // StreamOpened calls not yet closed
  std::list<Entry> lru;        // front = most recently used
  std::list<Entry> awaited;    // chunks kept for their reader, in no order that matters
  std::unordered_map<CacheKey, std::list<Entry>::iterator, CacheKeyHash> map;

  // Unlinks `it` from the map and its list; its buffer returns to the idle
  // list when nobody else holds it.
  void Remove(std::list<Entry>::iterator it) {
    std::shared_ptr<const ChunkBuffer> data = std::move(it->data);  // let go last, after the bookkeeping
    map.erase(it->key);
    if (it->awaited) {
      awaited_bytes -= data->size();
      awaited.erase(it);
      TellIdle();
      return;
    }
    bytes -= data->size();
    TellIdle();
    lru.erase(it);
  }
  // What the idle list may keep. While a stream is open, idle buffers may
  // also take the awaited room that awaited chunks leave free: a stream's
  // awaited chunks come and go all through its read, and their buffers
  // are the next decodes' memory (freed and mapped again, each would be
  // zeroed by the kernel once more: 10 % of a chain decode's time). Once
  // no stream is open the idle list shrinks back to the LRU's capacity.
  void TellIdle() { idle->SetCached(bytes + awaited_bytes, streams > 0 ? awaited_capacity : 0); }
  // An awaited entry joins the LRU as its most recently used entry.
  void Release(std::list<Entry>::iterator it) {
    it->awaited = false;
    awaited_bytes -= it->data->size();
    bytes += it->data->size();
    lru.splice(lru.begin(), awaited, it);
  }
  void EvictToFit() {
    while (bytes > capacity && !lru.empty()) Remove(std::prev(lru.end()));
    TellIdle();
  }
};

// Idle buffers count against the LRU's capacity only: awaited chunks are
// bounded by their own room, and the arena holds all three.
ChunkCache::ChunkCache(uint64_t capacity_bytes, uint64_t idle_reserve_bytes, uint64_t awaited_capacity_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->capacity = capacity_bytes;
  impl_->awaited_capacity = awaited_capacity_bytes;
  impl_->idle = std::make_shared<IdleBuffers>(capacity_bytes, idle_reserve_bytes);
  impl_->arena = std::make_shared<ChunkArena>(capacity_bytes + idle_reserve_bytes + awaited_capacity_bytes);
}

ChunkCache::~ChunkCache() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->map.clear();
    impl_->lru.clear();
    impl_->awaited.clear();
    impl_->bytes = 0;
    impl_->awaited_bytes = 0;
  }
  impl_->idle->Close();
}

std::shared_ptr<const ChunkBuffer> ChunkCache::Get(const ObjectId& blob, uint32_t chunk, bool release_awaited) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->map.find(CacheKey{blob, chunk});
  if (it == impl_->map.end()) return nullptr;
  auto entry = it->second;
  if (!entry->awaited) {
    impl_->lru.splice(impl_->lru.begin(), impl_->lru, entry);
  } else if (release_awaited) {
    impl_->Release(entry);
    impl_->EvictToFit();
  }
  return entry->data;
}

void ChunkCache::Put(const ObjectId& blob, uint32_t chunk, std::shared_ptr<const ChunkBuffer> data, bool awaited) {
  if (data == nullptr) return;
  std::lock_guard lock(impl_->mu);
  CacheKey key{blob, chunk};
  auto it = impl_->map.find(key);
  if (it != impl_->map.end()) impl_->Remove(it->second);
  const uint64_t size = data->size();
  if (awaited && impl_->awaited_bytes + size <= impl_->awaited_capacity) {
    impl_->awaited_bytes += size;
    impl_->awaited.push_front(Impl::Entry{key, std::move(data), 0, true});
    impl_->map.emplace(key, impl_->awaited.begin());
    impl_->TellIdle();
    return;
  }
  // An entry larger than the whole cache would only evict everything else.
  if (size > impl_->capacity) return;
  impl_->bytes += size;
  impl_->lru.push_front(Impl::Entry{key, std::move(data)});
  impl_->map.emplace(key, impl_->lru.begin());
  impl_->EvictToFit();
}

void ChunkCache::StreamOpened() {
  std::lock_guard lock(impl_->mu);
  ++impl_->streams;
  impl_->TellIdle();
}

void ChunkCache::StreamClosed() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->streams > 0) --impl_->streams;
    impl_->TellIdle();
    if (impl_->streams > 0) return;
  }
  // No reader streams now: the scratches its decodes took (up to one per
  // level of a chain per thread, tens of MiB each for 4 MiB chunks) need
  // not stay (freed outside the cache's lock: unmapping takes a while).
  impl_->scratch.Trim(kScratchesBetweenStreams);
}

void ChunkCache::ReleaseAwaited(const ObjectId& blob) {
  std::lock_guard lock(impl_->mu);
  if (impl_->awaited.empty()) return;
  for (auto it = impl_->awaited.begin(); it != impl_->awaited.end();) {
    auto next = std::next(it);
    if (it->key.blob == blob) impl_->Release(it);
    it = next;
  }
  impl_->EvictToFit();
}

std::shared_ptr<ChunkBuffer> ChunkCache::AcquireBuffer(size_t size) {
  std::unique_ptr<ChunkBuffer> buffer = impl_->idle->Take(size);
  if (!buffer) {
    // A full cache makes room for the chunk about to be decoded now: the
    // least recently used chunks leave it and their buffers (when nobody
    // holds them) go idle, for this decode to reuse. Evicting only at
    // Put would free them instead: cached plus idle memory would not fit.
    {
      std::lock_guard lock(impl_->mu);
      while (!impl_->lru.empty() && impl_->bytes + size > impl_->capacity) impl_->Remove(std::prev(impl_->lru.end()));
    }
    buffer = impl_->idle->Take(size);
  }
  if (!buffer) buffer = std::make_unique<ChunkBuffer>(impl_->arena);
  // Chunks are nearly all the same size: an idle buffer nearly always fits.
  buffer->Resize(size);
  return std::shared_ptr<ChunkBuffer>(buffer.release(), ReturnToIdle{impl_->idle});
}

void ChunkCache::Drop(const ObjectId& blob, uint32_t chunk) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->map.find(CacheKey{blob, chunk});
  if (it == impl_->map.end()) return;
  impl_->Remove(it->second);
}

bool ChunkCache::NoteRead(const ObjectId& blob, uint32_t chunk, uint64_t bytes, bool keep) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->map.find(CacheKey{blob, chunk});
  if (it == impl_->map.end()) return false;
  Impl::Entry& e = *it->second;
  const bool done_before = e.read >= e.data->size();
  e.read += bytes;
  if (e.read < e.data->size()) return false;
  if (!keep) {
    impl_->Remove(it->second);
    return true;
  }
  if (e.awaited) {
    impl_->Release(it->second);
    impl_->EvictToFit();
  }
  return !done_before;
}

CodecScratchPool& ChunkCache::scratch_pool() { return impl_->scratch; }

void ChunkCache::SetSpill(ChunkSpill* spill) { impl_->spill.store(spill, std::memory_order_release); }

ChunkSpill* ChunkCache::spill() const { return impl_->spill.load(std::memory_order_acquire); }

uint64_t ChunkCache::capacity_bytes() const { return impl_->capacity; }

uint64_t ChunkCache::size_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->bytes + impl_->awaited_bytes;
}

uint64_t ChunkCache::awaited_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->awaited_bytes;
}

uint64_t ChunkCache::awaited_capacity_bytes() const { return impl_->awaited_capacity; }

void ChunkCache::NoteDecode() { impl_->decodes.fetch_add(1, std::memory_order_relaxed); }

uint64_t ChunkCache::decodes() const { return impl_->decodes.load(std::memory_order_relaxed); }

bool ChunkCache::HasAwaitedRoom(uint64_t bytes) const {
  std::lock_guard lock(impl_->mu);
  return impl_->awaited_bytes + bytes <= impl_->awaited_capacity;
}

uint64_t ChunkCache::idle_bytes() const { return impl_->idle->bytes(); }

}  // namespace ckptfs

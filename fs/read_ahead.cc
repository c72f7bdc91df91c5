#include "fs/read_ahead.h"

#include <algorithm>

#include "fs/next_tensor.h"

namespace ckptfs::fs {

ReadAhead::ReadAhead(unsigned workers, uint64_t window_bytes, uint64_t drop_lag_bytes)
    : window_bytes_(window_bytes), drop_lag_bytes_(drop_lag_bytes) {
  if (window_bytes_ == 0) return;
  for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(); });
}

ReadAhead::~ReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ReadAhead::RestartLocked(Stream& stream, uint32_t first) {
  stream.cancelled->store(true, std::memory_order_relaxed);
  stream.cancelled = std::make_shared<std::atomic<bool>>(false);
  stream.seen = false;
  stream.queued_until = 0;
  stream.run_first = first;
  stream.run_tensor_segment = -1;
  stream.dropped_until = first;
}

void ReadAhead::DropPredictionLocked(Stream& stream) {
  if (stream.predicted.empty()) return;
  stream.next_cancelled->store(true, std::memory_order_relaxed);
  stream.next_cancelled = std::make_shared<std::atomic<bool>>(false);
  stream.predicted.clear();
}

void ReadAhead::ResolvePredictionLocked(Stream& stream, int32_t segment) {
  auto hit = std::find_if(stream.predicted.begin(), stream.predicted.end(),
                          [segment](const Stream::Predicted& p) { return p.segment == segment; });
  if (hit == stream.predicted.end()) {
    DropPredictionLocked(stream);
    return;
  }
  // The guess was right: the run does not queue the chunks queued for it
  // again, and the tensors predicted after it stay queued.
  stream.queued_until = std::max(stream.queued_until, hit->queued_until);
  stream.predicted.erase(stream.predicted.begin(), hit + 1);
}

void ReadAhead::OnRead(Stream& stream, const std::shared_ptr<const BlobReader>& blob, uint64_t offset,
                       uint64_t length) {
  const std::vector<ChunkInfo>& chunks = blob->chunks();
  if (chunks.size() < 2) return;
  const uint32_t first = ChunkIndexAt(chunks, offset);
  const uint32_t last = ChunkIndexAt(chunks, offset + length - 1);
  std::vector<Job> fresh;
  std::vector<uint32_t> drop;
  std::shared_ptr<const BlobReader> left;  // the blob the stream read before, closed outside the lock
  // Decodes queued now skip chunks the reader finishes with from here on.
  const uint64_t ticket = blob->prefetch_ticket();
  {
    std::lock_guard<std::mutex> lock(stream.mu);
    if (stream.blob != blob) {
      DropPredictionLocked(stream);
      RestartLocked(stream, first);
      left = std::move(stream.blob);
      blob->OpenStream();
      stream.blob = blob;
    }
    // The kernel sends the reads of one stretch from several threads, and
    // its read-ahead runs ahead of the reader's own reads: any read within
    // the run so far, or just past it, continues the run; so does one a
    // little before the run's start (the reads that arrive late), which
    // would otherwise restart the run and queue decodes of chunks the
    // reader has already had.
    const bool sequential = stream.seen && first <= static_cast<uint64_t>(stream.last_chunk) + 1 &&
                            (first >= stream.run_first || offset + length + drop_lag_bytes_ > stream.furthest_end);
    if (!sequential) RestartLocked(stream, first);
    const bool was_seen = stream.seen;
    const std::vector<SegmentInfo>& segments = blob->segments();
    for (uint32_t k = first; k <= last && stream.run_tensor_segment < 0; ++k) {
      const int32_t s = chunks[k].segment;
      if (s >= 0 && static_cast<size_t>(s) < segments.size() && segments[s].tensor >= 0) {
        stream.run_tensor_segment = s;
        ResolvePredictionLocked(stream, s);
      }
    }
    stream.last_chunk = was_seen ? std::max(stream.last_chunk, last) : last;
    stream.furthest_end = was_seen ? std::max(stream.furthest_end, offset + length) : offset + length;
    stream.seen = true;
    for (; stream.dropped_until < stream.last_chunk; ++stream.dropped_until) {
      const ChunkInfo& c = chunks[stream.dropped_until];
      if (c.logical_offset + c.logical_length + drop_lag_bytes_ > stream.furthest_end) break;
      drop.push_back(stream.dropped_until);
    }
    const int32_t segment =
        stream.run_tensor_segment >= 0 ? stream.run_tensor_segment : chunks[stream.last_chunk].segment;
    // Only the second sequential read starts decoding ahead: a single read
    // (a header, a zip directory) is no stream.
    uint32_t c = std::max(stream.queued_until, stream.last_chunk + 1);
    uint64_t ahead = 0;
    for (uint32_t k = stream.last_chunk + 1; k < c && k < chunks.size(); ++k) ahead += chunks[k].logical_length;
    for (; was_seen && c < chunks.size() && ahead < window_bytes_; ++c) {
      if (chunks[c].segment != segment) break;
      ahead += chunks[c].logical_length;
      fresh.push_back(Job{blob, c, stream.cancelled, ticket});
    }
    stream.queued_until = std::max(stream.queued_until, c);
    // The window reached the end of the run's tensor: the rest of it goes
    // to the first chunks of the tensor read next.
    const bool at_tensor_end = c >= chunks.size() || chunks[c].segment != segment;
    if (was_seen && stream.run_tensor_segment >= 0 && at_tensor_end && ahead < window_bytes_)
      QueueNextTensorLocked(stream, blob, ahead, ticket, &fresh);
  }
  if (left) left->CloseStream();
  for (uint32_t k : drop) blob->DropCached(k);
  if (fresh.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    for (Job& j : fresh) jobs_.push_back(std::move(j));
  }
  cv_.notify_all();
}

void ReadAhead::QueueNextTensorLocked(Stream& stream, const std::shared_ptr<const BlobReader>& blob, uint64_t ahead,
                                      uint64_t ticket, std::vector<Job>* fresh) {
  const std::vector<ChunkInfo>& chunks = blob->chunks();
  const std::vector<SegmentInfo>& segments = blob->segments();
  int32_t next = stream.run_tensor_segment;
  for (size_t i = 0; i < kMaxPredicted && ahead < window_bytes_; ++i) {
    next = PredictNextTensorSegment(blob->format(), segments, next);
    if (next < 0 || next == stream.run_tensor_segment) return;
    // The list follows the chain from the run's tensor; past a point where
    // it does not, it is rebuilt (the decodes queued for the entries cut
    // off stay queued: they are within the window already counted).
    if (i < stream.predicted.size() && stream.predicted[i].segment != next)
      stream.predicted.erase(stream.predicted.begin() + static_cast<ptrdiff_t>(i), stream.predicted.end());
    if (i == stream.predicted.size()) stream.predicted.push_back({next, segments[next].first_chunk});
    Stream::Predicted& p = stream.predicted[i];
    const SegmentInfo& seg = segments[next];
    const uint64_t end = std::min<uint64_t>(uint64_t{seg.first_chunk} + seg.chunk_count, chunks.size());
    for (uint32_t k = seg.first_chunk; k < p.queued_until && k < end; ++k) ahead += chunks[k].logical_length;
    uint32_t c = p.queued_until;
    for (; c < end && ahead < window_bytes_; ++c) {
      ahead += chunks[c].logical_length;
      fresh->push_back(Job{blob, c, stream.next_cancelled, ticket});
    }
    predicted_queued_.fetch_add(c - p.queued_until, std::memory_order_relaxed);
    p.queued_until = c;
  }
}

void ReadAhead::Close(Stream& stream) {
  std::shared_ptr<const BlobReader> left;
  {
    std::lock_guard<std::mutex> lock(stream.mu);
    stream.cancelled->store(true, std::memory_order_relaxed);
    DropPredictionLocked(stream);
    left = std::move(stream.blob);
  }
  if (left) left->CloseStream();
}

void ReadAhead::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    if (job.cancelled->load(std::memory_order_relaxed)) continue;
    lock.unlock();
    decodes_started_.fetch_add(1, std::memory_order_relaxed);
    // A failure is not reported here: the reader's own read of the chunk
    // decodes it again and reports it.
    (void)job.blob->Prefetch(job.chunk, job.ticket);
    job = Job{};  // drop the reader outside the lock
    lock.lock();
  }
}

}  // namespace ckptfs::fs

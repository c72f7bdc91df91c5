// Decoding ahead of sequential readers. When an open file reads a committed
// blob chunk after chunk, the next chunks are decoded into the chunk cache
// on worker threads, so the request thread that asks for one finds it
// decoded (or joins the decode in flight, BlobReader's CachedChunk) instead
// of decoding it itself: the decode runs beside the reader and the kernel's
// copy to it. The kernel's own read-ahead reaches only a few MiB past the
// reader; this keeps a window of decoded bytes ahead of the reader.
//
// Stale data cannot come from here: decoded chunks are keyed by the
// object's content address, so a replaced file (a new object) never finds
// the old version's chunks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "codec/container/blob.h"

namespace ckptfs::fs {

class ReadAhead {
 public:
  // `workers` decode threads; `window_bytes` of decoded chunks are kept
  // queued or decoded past the furthest chunk a stream has read (0: no
  // decoding ahead, and no threads; finished chunks are still dropped).
  // A run's chunks that end `drop_lag_bytes` or more before the end of its
  // furthest read leave the cache. The lag is in bytes, not chunks: a
  // torch.save file puts tiny chunks (biases, small records) between the
  // 4 MiB ones, and a lag of 8 chunks dropped chunks the reader was still
  // reading (18% of a 957 MB torch.load decoded twice).
  ReadAhead(unsigned workers, uint64_t window_bytes, uint64_t drop_lag_bytes);
  // Drops the queued decodes and joins the workers (after the running
  // decodes end).
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The read position of one open file. Thread safety: used only through
  // ReadAhead's methods, which lock it.
  class Stream {
   public:
    Stream() = default;
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

   private:
    friend class ReadAhead;
    std::mutex mu;
    // What the positions below refer to; a stream of it is open
    // (BlobReader::OpenStream) until the file is closed or reads another.
    std::shared_ptr<const BlobReader> blob;
    bool seen = false;                 // a read of `blob` came before
    uint32_t last_chunk = 0;           // furthest chunk read so far
    uint64_t furthest_end = 0;         // end offset of the furthest read of the run
    uint32_t queued_until = 0;         // chunks below this are queued or decoded
    uint32_t run_first = 0;            // first chunk of this run of sequential reads
    int32_t run_tensor_segment = -1;   // the first tensor segment the run read, or -1
    uint32_t dropped_until = 0;        // chunks of the run below this left the cache
    // Set when the stream seeks away or closes: its queued decodes are
    // skipped. A fresh token then starts the next run.
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    // The tensor segments the reader is expected to read after the run's
    // tensor, in that order (PredictNextTensorSegment, applied again), each
    // with how far its chunks are queued. Their decodes carry their own
    // token, apart from the runs': a run that starts one of these tensors
    // keeps them (and drops the ones before it from the list), a run that
    // starts another tensor cancels them.
    struct Predicted {
      int32_t segment = -1;
      uint32_t queued_until = 0;
    };
    std::vector<Predicted> predicted;
    std::shared_ptr<std::atomic<bool>> next_cancelled = std::make_shared<std::atomic<bool>>(false);
  };

  // A read of [offset, offset + length) of `blob` through `stream`.
  // Sequential reads queue the chunks of the window ahead; a read
  // elsewhere cancels what was queued. The window stays within the first
  // tensor the run reads (files without tensors: the segment being read):
  // torch.load reads one record at a time in pickle order, not file order,
  // so the chunks past a tensor are rarely read next, and the kernel's own
  // read-ahead past a record looks like a sequential read into the next
  // one (following it cost 13-20% more decodes of a 1 GB torch.load). A
  // plain copy loses little: the kernel's read-ahead (readahead=) already
  // asks for the next chunks.
  // Once the window reaches the end of the run's tensor, what is left of it
  // decodes the first chunks of the tensor the reader will likely read
  // next (fs/next_tensor.h: the next storage in pickle order for torch
  // zips, the next tensor in the file otherwise), and of the ones after it
  // while the window has room (a small bias between two weights does not
  // stop it), so a reader that jumps there does not wait for its first
  // chunks. The guess is cancelled when the reader starts another tensor,
  // or the file is closed.
  // Chunks a run has left drop_lag_bytes behind its furthest read leave
  // the chunk cache, so that a long stream recycles a few buffers instead
  // of filling the cache with chunks it never reads again (fresh memory
  // faults on first touch); short runs and random reads keep theirs.
  // REQUIRES: length > 0, within the blob's logical size.
  void OnRead(Stream& stream, const std::shared_ptr<const BlobReader>& blob, uint64_t offset, uint64_t length);
  // The file was closed: its queued decodes are skipped, and its stream
  // of the blob is closed.
  void Close(Stream& stream);

  // Decodes started by workers so far (tests, logs).
  uint64_t decodes_started() const { return decodes_started_.load(std::memory_order_relaxed); }
  // Chunks queued for a predicted next tensor so far (tests, logs).
  uint64_t predicted_queued() const { return predicted_queued_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    std::shared_ptr<const BlobReader> blob;
    uint32_t chunk = 0;
    std::shared_ptr<std::atomic<bool>> cancelled;
    uint64_t ticket = 0;  // BlobReader::prefetch_ticket() when queued
  };
  static constexpr size_t kMaxPredicted = 16;
  // Starts a new run at chunk `first`.
  static void RestartLocked(Stream& stream, uint32_t first);
  // Cancels the queued decodes of the predicted tensors.
  static void DropPredictionLocked(Stream& stream);
  // The run now reads tensor segment `segment`: the predicted tensors up to
  // it leave the list (their decodes stay queued) when it is one of them;
  // otherwise the guess was wrong and its decodes are cancelled.
  static void ResolvePredictionLocked(Stream& stream, int32_t segment);
  // Queues the chunks of the tensors predicted to follow the run's tensor,
  // in the order they will be read, while `ahead` (bytes already queued
  // past the reader) stays under the window; at most kMaxPredicted tensors
  // (a run of tiny ones costs a job each).
  void QueueNextTensorLocked(Stream& stream, const std::shared_ptr<const BlobReader>& blob, uint64_t ahead,
                             uint64_t ticket, std::vector<Job>* fresh);
  void Work();

  const uint64_t window_bytes_;
  const uint64_t drop_lag_bytes_;
  std::mutex mu_;  // guards jobs_ and stop_; taken after a Stream's mu
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::atomic<uint64_t> decodes_started_{0};
  std::atomic<uint64_t> predicted_queued_{0};
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::fs

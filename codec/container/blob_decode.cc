// Whole-file decodes of a blob: into memory (DecodeAll) or streamed into
// a sink in file order on threads (DecodeToSink), each checked against the
// blob's whole-file checksum.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "codec/common/hash.h"
#include "codec/container/blob.h"

namespace ckptfs {
namespace {

// [begin, end) ranges of the file of whole chunks, in file order: a chunk
// joins the piece before it while that stays within `target` bytes (a
// larger chunk is a piece of its own).
std::vector<std::pair<uint64_t, uint64_t>> ChunkPieces(const std::vector<ChunkInfo>& chunks, uint64_t target) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (const ChunkInfo& c : chunks) {
    const uint64_t end = c.logical_offset + c.logical_length;
    if (pieces.empty() || end - pieces.back().first > target)
      pieces.emplace_back(c.logical_offset, end);
    else
      pieces.back().second = end;
  }
  return pieces;
}

Status CheckFileChecksum(const BlobReader& reader, uint64_t have) {
  if (have == reader.file_checksum()) return Status::Ok();
  return Status::ChecksumMismatch(
      fmt::format("blob: whole-file checksum want={:016x} have={:016x}", reader.file_checksum(), have));
}

}  // namespace

Result<std::vector<std::byte>> DecodeAll(const BlobReader& reader) {
  if (reader.logical_size() > SIZE_MAX) return Status::NoMemory("decode: file too large for memory");
  std::vector<std::byte> out(reader.logical_size());
  RETURN_IF_ERROR(reader.ReadAt(0, out));
  RETURN_IF_ERROR(CheckFileChecksum(reader, Checksum64(out)));
  return out;
}

Status DecodeToSink(const BlobReader& reader, ByteSink* sink, unsigned threads, uint64_t piece_bytes) {
  threads = std::max(1u, threads);
  // On threads, a file of a few pieces is cut finer (about 4 pieces per
  // thread, whole chunks still), so that the threads finish together.
  if (threads > 1) piece_bytes = std::min(piece_bytes, reader.logical_size() / (4 * uint64_t{threads}));
  const auto pieces = ChunkPieces(reader.chunks(), std::max<uint64_t>(1, piece_bytes));
  // The decoded chunks' own memory goes to the sink from one thread, in
  // file order, hashed on the way for the whole-file checksum: no copy of
  // a piece, and one writer. (Threads that wrote their own pieces at
  // their offsets, by pwrite, queued on the output file's lock in the
  // kernel, which spins: a decode of a 957 MB delta version on two
  // threads took twice the system time, docs/bench.md.)
  Checksum64Stream hash;
  // Read as pieces of the decoded chunks (ReadPieces): with a chunk cache
  // a chunk leaves it once all its bytes were taken, so the cache holds
  // only the chunks other chunks need (a prediction's optimizer state, a
  // step-space moment's second moment) until their turn, instead of
  // filling with the whole file and pushing out the bases' chunks; as a
  // stream, the ones decoded ahead of it wait for it outside the LRU.
  const ReaderStream stream(reader);
  auto emit = [&](const std::vector<BlobReader::Piece>& parts) -> Status {
    for (const BlobReader::Piece& part : parts) {
      hash.Update(part.data);
      RETURN_IF_ERROR(sink->Append(part.data));
    }
    return Status::Ok();
  };
  if (threads == 1 || pieces.size() <= 1) {
    std::vector<BlobReader::Piece> parts;
    for (auto [begin, end] : pieces) {
      parts.clear();
      RETURN_IF_ERROR(reader.ReadPieces(begin, end - begin, &parts));
      RETURN_IF_ERROR(emit(parts));
    }
    return CheckFileChecksum(reader, hash.Digest());
  }
  // `threads` decoders fill a ring of 2 slots per thread in file order
  // while this thread hashes and writes the finished pieces in order, so
  // that the writes overlap the decode of the next pieces. A slot holds
  // its piece's decoded chunks until they are written.
  const size_t slots = 2 * size_t{threads};
  std::vector<std::vector<BlobReader::Piece>> held(slots);
  std::mutex mu;
  std::condition_variable cv;
  size_t next_to_take = 0, next_to_write = 0;
  std::vector<char> done(pieces.size(), 0);
  Status failure;
  bool stop = false;
  auto decoder = [&] {
    for (;;) {
      size_t i;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || next_to_take >= pieces.size() || next_to_take < next_to_write + slots; });
        if (stop || next_to_take >= pieces.size()) return;
        i = next_to_take++;
      }
      auto [begin, end] = pieces[i];
      std::vector<BlobReader::Piece>& parts = held[i % slots];  // emptied by the writing thread
      parts.clear();
      Status s = reader.ReadPieces(begin, end - begin, &parts);
      std::lock_guard lock(mu);
      if (!s.ok() && failure.ok()) failure = std::move(s), stop = true;
      done[i] = 1;
      cv.notify_all();
    }
  };
  Status written;
  {
    std::vector<std::jthread> workers;
    for (unsigned t = 0; t < threads; ++t) workers.emplace_back(decoder);
    for (size_t k = 0; k < pieces.size() && written.ok(); ++k) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || done[k]; });
        if (stop) break;
      }
      written = emit(held[k % slots]);
      held[k % slots].clear();  // the chunks go back to the cache's idle buffers
      std::lock_guard lock(mu);
      next_to_write = k + 1;
      if (!written.ok()) stop = true;
      cv.notify_all();
    }
    std::lock_guard lock(mu);  // the workers see stop or the end and return
    stop = true;
    cv.notify_all();
  }
  RETURN_IF_ERROR(std::move(failure));
  RETURN_IF_ERROR(std::move(written));
  return CheckFileChecksum(reader, hash.Digest());
}

}  // namespace ckptfs

// The digests of a staging file hashed as its writes arrive
// (fs/staged_digest.h): equal to a pass over the file whenever they are
// given, and never given for bytes they did not follow.
#include "fs/staged_digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "codec/common/io.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::RandomBytes;
using testing::TempDir;

ByteSpan Piece(const std::vector<std::byte>& bytes, size_t off, size_t n) { return ByteSpan(bytes.data() + off, n); }

void ExpectDigestsOf(const StagedDigest& digest, ByteSpan file) {
  const std::optional<FileDigests> d = digest.For(file.size());
  ASSERT_TRUE(d.has_value());
  const FileDigests want = DigestFile(file);
  EXPECT_EQ(d->id, want.id);
  EXPECT_EQ(d->checksum, want.checksum);
  EXPECT_EQ(d->id, ObjectId::Of(file));
}

TEST(StagedDigest, UnknownUntilReset) {
  StagedDigest digest;
  EXPECT_FALSE(digest.For(0));
  digest.Append(digest.BeginWrite(), 0, ByteSpan());
  EXPECT_FALSE(digest.For(0));
  digest.Reset();
  ExpectDigestsOf(digest, ByteSpan());
}

TEST(StagedDigest, DisabledIsNeverKnown) {
  const std::vector<std::byte> bytes = RandomBytes(1000, 3);
  StagedDigest digest(/*enabled=*/false);
  digest.Reset();
  EXPECT_FALSE(digest.For(0));
  digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, bytes.size()));
  digest.Truncated(0);
  EXPECT_FALSE(digest.For(0));
  EXPECT_FALSE(digest.For(bytes.size()));
}

TEST(StagedDigest, InOrderWritesOfAnySizeGiveTheFilesDigests) {
  const std::vector<std::byte> bytes = RandomBytes(3 << 20, 7);
  std::mt19937 rng(3);
  StagedDigest digest;
  digest.Reset();
  size_t off = 0;
  while (off < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - off, std::uniform_int_distribution<size_t>(0, 300000)(rng));
    digest.Append(digest.BeginWrite(), off, Piece(bytes, off, n));
    off += n;
    EXPECT_FALSE(digest.For(off + 1));  // only the hashed length
  }
  ExpectDigestsOf(digest, bytes);
}

TEST(StagedDigest, AnyWriteButAtTheEndMakesThemUnknownUntilReset) {
  const std::vector<std::byte> bytes = RandomBytes(1 << 16, 9);
  for (const uint64_t at : {uint64_t{0}, uint64_t{100}, uint64_t{4095}, uint64_t{4097}, uint64_t{1} << 20}) {
    SCOPED_TRACE(at);
    StagedDigest digest;
    digest.Reset();
    digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, 4096));
    digest.Append(digest.BeginWrite(), at, Piece(bytes, 0, 16));  // an overwrite, or past a hole
    EXPECT_FALSE(digest.For(4096));
    EXPECT_FALSE(digest.For(4096 + 16));
    EXPECT_FALSE(digest.For(at + 16));
    // Writes that look in order again do not bring them back.
    digest.Append(digest.BeginWrite(), 4096, Piece(bytes, 4096, 100));
    EXPECT_FALSE(digest.For(4196));
    digest.Reset();
    digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, bytes.size()));
    ExpectDigestsOf(digest, bytes);
  }
}

TEST(StagedDigest, TruncateKeepsOnlyZeroOrTheHashedLength) {
  const std::vector<std::byte> bytes = RandomBytes(10000, 11);
  StagedDigest digest;
  digest.Reset();
  digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, 6000));
  digest.Truncated(6000);  // the size it has: nothing changed
  digest.Append(digest.BeginWrite(), 6000, Piece(bytes, 6000, 4000));
  ExpectDigestsOf(digest, bytes);
  digest.Truncated(9999);
  EXPECT_FALSE(digest.For(9999));
  EXPECT_FALSE(digest.For(10000));
  digest.Truncated(0);
  ExpectDigestsOf(digest, ByteSpan());
  digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, 5000));
  digest.Truncated(7000);  // extended with zeros it never saw
  EXPECT_FALSE(digest.For(7000));
  digest.Reset();
  digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, 100));
  digest.Invalidate();  // fallocate, a copy, a failed write
  EXPECT_FALSE(digest.For(100));
}

TEST(StagedDigest, AWriteRacedByATruncateIsNeverCounted) {
  const std::vector<std::byte> bytes = RandomBytes(8192, 13);
  // A write takes its ticket, a truncate lands (to zero, or to the hashed
  // length), then the write's bytes are appended at what is now the end:
  // they would be hashed for a file that does not hold them there.
  for (const uint64_t truncated_to : {uint64_t{0}, uint64_t{4096}}) {
    SCOPED_TRACE(truncated_to);
    StagedDigest digest;
    digest.Reset();
    digest.Append(digest.BeginWrite(), 0, Piece(bytes, 0, 4096));
    const StagedDigest::Ticket stale = digest.BeginWrite();
    digest.Truncated(truncated_to);
    digest.Append(stale, truncated_to, Piece(bytes, 4096, 4096));
    EXPECT_FALSE(digest.For(truncated_to));
    EXPECT_FALSE(digest.For(truncated_to + 4096));
  }
}

// Writers on several threads, as FUSE's worker threads write one file:
// each takes its ticket, writes its bytes to a real file and appends them.
// Whatever the interleaving (in order, out of order, overlapping), the
// digests are either those of the file's bytes or unknown.
TEST(StagedDigest, ConcurrentWritersNeverGiveAWrongDigest) {
  TempDir dir;
  int given = 0;
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE(round);
    const std::string path = dir.path() + "/staged";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    const std::vector<std::byte> bytes = RandomBytes(1 << 18, 100 + round);
    const std::vector<std::byte> other = RandomBytes(1 << 18, 500 + round);
    StagedDigest digest;
    digest.Reset();
    constexpr size_t kPiece = 4096;
    constexpr size_t kPieces = (1 << 18) / kPiece;
    std::atomic<size_t> next{0};
    auto writer = [&](int id) {
      std::mt19937 rng(round * 10 + id);
      for (size_t p; (p = next.fetch_add(1)) < kPieces;) {
        // Some rounds also rewrite earlier pieces with other bytes.
        const bool rewrite = round % 3 == 2 && p > 0 && rng() % 16 == 0;
        const size_t at = rewrite ? (rng() % p) * kPiece : p * kPiece;
        const ByteSpan data = rewrite ? Piece(other, at, kPiece) : Piece(bytes, at, kPiece);
        const StagedDigest::Ticket t = digest.BeginWrite();
        ASSERT_EQ(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(at)), static_cast<ssize_t>(kPiece));
        digest.Append(t, at, data);
        if (rewrite) {  // and the piece it was due to write
          const StagedDigest::Ticket t2 = digest.BeginWrite();
          ASSERT_EQ(::pwrite(fd, bytes.data() + p * kPiece, kPiece, static_cast<off_t>(p * kPiece)),
                    static_cast<ssize_t>(kPiece));
          digest.Append(t2, p * kPiece, Piece(bytes, p * kPiece, kPiece));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int id = 0; id < 1 + round % 4; ++id) threads.emplace_back(writer, id);
    for (auto& t : threads) t.join();
    struct stat st;
    ASSERT_EQ(::fstat(fd, &st), 0);
    std::vector<std::byte> file(static_cast<size_t>(st.st_size));
    ASSERT_EQ(::pread(fd, file.data(), file.size(), 0), static_cast<ssize_t>(file.size()));
    ::close(fd);
    if (const std::optional<FileDigests> d = digest.For(file.size())) {
      ++given;
      EXPECT_EQ(d->id, ObjectId::Of(file));
      EXPECT_EQ(d->checksum, DigestFile(file).checksum);
    }
  }
  EXPECT_GT(given, 0);  // the single-writer rounds at least
}

}  // namespace
}  // namespace ckptfs::fs

// Delta bases across a framework's folders (ScanRoleCandidates,
// MergeBaseCandidates), a committed version's reconstruction kept decoded
// for the next one, and identical content stored once (content_index.h),
// on a store without FUSE.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <thread>

#include "fs/base_candidates.h"
#include "fs/commit_pipeline.h"
#include "fs/content_index.h"
#include "fs/gc.h"
#include "fs/store.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::Commit;
using testing::OpenDaemonStore;
using testing::RandomBytes;
using testing::TempDir;

std::vector<std::string> Paths(const std::vector<BaseCandidate>& candidates) {
  std::vector<std::string> out;
  for (const BaseCandidate& c : candidates) out.push_back(c.rel_path);
  return out;
}

void SetMtime(const std::string& path, time_t when) {
  struct timespec t[2] = {{when, 0}, {when, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0);
}

TEST(RoleCandidates, SiblingStepFoldersOfTheSameFileOnly) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  int n = 0;
  for (const char* rel : {"run/checkpoint-100/optimizer.pt", "run/checkpoint-200/optimizer.pt",
                          "run/checkpoint-200/scheduler.pt", "run/tmp-checkpoint-250/optimizer.pt",
                          "other/checkpoint-300/optimizer.pt", "run/checkpoint-300/optimizer.pt"}) {
    auto v = Commit(*store, rel, RandomBytes(20000, ++n));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    SetMtime(dir.path() + "/" + rel, 1000000 + n);
  }
  // The newest of its role, oldest first; the file itself, other files of
  // a save and another run's folder are not candidates.
  auto found = ScanRoleCandidates(*store, "run/checkpoint-300/optimizer.pt", 4, nullptr);
  EXPECT_EQ(Paths(found), (std::vector<std::string>{"run/checkpoint-100/optimizer.pt",
                                                     "run/checkpoint-200/optimizer.pt",
                                                     "run/tmp-checkpoint-250/optimizer.pt"}));
  for (const BaseCandidate& c : found) EXPECT_TRUE(c.same_role);
  EXPECT_EQ(Paths(ScanRoleCandidates(*store, "run/checkpoint-300/optimizer.pt", 1, nullptr)),
            (std::vector<std::string>{"run/tmp-checkpoint-250/optimizer.pt"}));
  // A staged folder finds the committed ones.
  EXPECT_EQ(ScanRoleCandidates(*store, "run/tmp-checkpoint-400/optimizer.pt", 4, nullptr).size(), 4u);
  // A path with nothing that changes between saves has no role siblings.
  EXPECT_TRUE(ScanRoleCandidates(*store, "run/plain/optimizer.pt", 4, nullptr).empty());
}

TEST(RoleCandidates, PerRankFilesChainAgainstTheSameRank) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  int n = 0;
  for (int step : {100, 200})
    for (int rank : {0, 1}) {
      std::string rel = "iter_000" + std::to_string(step) + "/mp_rank_0" + std::to_string(rank) + "/model_optim_rng.pt";
      ASSERT_TRUE(Commit(*store, rel, RandomBytes(20000, ++n)).ok());
    }
  auto found = ScanRoleCandidates(*store, "iter_0000300/mp_rank_01/model_optim_rng.pt", 4, nullptr);
  EXPECT_EQ(Paths(found), (std::vector<std::string>{"iter_000100/mp_rank_01/model_optim_rng.pt",
                                                     "iter_000200/mp_rank_01/model_optim_rng.pt"}));
}

BaseCandidate Candidate(uint8_t id, const std::string& rel_path, std::vector<std::string> keys) {
  BaseCandidate c;
  c.id.bytes[0] = id;
  c.format = FileFormat::kTorchZip;
  c.logical_size = 1000;
  c.tensor_keys = std::move(keys);
  c.rel_path = rel_path;
  return c;
}

// Two files per save in one folder (a checkpoint and its weights): the
// folder's list holds the newest saves of both, the role's list older saves
// of the checkpoint too. Merged oldest first by commit time, the previous
// save is the base, not the one before it (which used to come last).
TEST(RoleCandidates, MergeOrdersBothListsByCommitTime) {
  const std::vector<std::string> ckpt_keys = {"model.w|f32|4", "optimizer.m|f32|4"};
  const std::vector<std::string> weight_keys = {"w|f32|4"};
  auto at = [](BaseCandidate c, int64_t t) {
    c.committed_ns = t;
    return c;
  };
  const FileRole role = RoleOf("run/ckpt_000025.pt");
  std::vector<BaseCandidate> in_dir = {at(Candidate(15, "run/ckpt_000015.pt", ckpt_keys), 150),
                                       at(Candidate(16, "run/model_000015.safetensors", weight_keys), 151),
                                       at(Candidate(20, "run/ckpt_000020.pt", ckpt_keys), 200),
                                       at(Candidate(21, "run/model_000020.safetensors", weight_keys), 201)};
  std::vector<BaseCandidate> in_role = {at(Candidate(5, "run/ckpt_000005.pt", ckpt_keys), 50),
                                        at(Candidate(10, "run/ckpt_000010.pt", ckpt_keys), 100),
                                        at(Candidate(15, "run/ckpt_000015.pt", ckpt_keys), 150),
                                        at(Candidate(20, "run/ckpt_000020.pt", ckpt_keys), 200)};
  auto merged = MergeBaseCandidates(role, in_dir, in_role);
  EXPECT_EQ(Paths(merged), (std::vector<std::string>{"run/ckpt_000005.pt", "run/ckpt_000010.pt", "run/ckpt_000015.pt",
                                                     "run/model_000015.safetensors", "run/ckpt_000020.pt",
                                                     "run/model_000020.safetensors"}));
  BaseChoice choice = ChooseBase(merged, FileFormat::kTorchZip, ckpt_keys, 1000, 10);
  ASSERT_NE(choice.candidate, nullptr);
  EXPECT_EQ(choice.candidate->rel_path, "run/ckpt_000020.pt");
}

TEST(RoleCandidates, MergeDropsOtherRanksAndPrefersTheOwnRole) {
  const std::vector<std::string> keys = {"a|f32|4", "b|f32|4"};
  const FileRole role = RoleOf("step-200/__1_0.distcp");
  std::vector<BaseCandidate> in_dir = {Candidate(1, "step-200/__0_0.distcp", keys),  // rank 0 of this save
                                       Candidate(2, "step-200/.metadata", {})};
  std::vector<BaseCandidate> in_role = {Candidate(3, "step-100/__1_0.distcp", keys)};
  auto merged = MergeBaseCandidates(role, in_dir, in_role);
  EXPECT_EQ(Paths(merged), (std::vector<std::string>{"step-200/.metadata", "step-100/__1_0.distcp"}));
  EXPECT_FALSE(merged[0].same_role);
  EXPECT_TRUE(merged[1].same_role);
  BaseChoice choice = ChooseBase(merged, FileFormat::kTorchZip, keys, 1000, 10);
  ASSERT_NE(choice.candidate, nullptr);
  EXPECT_EQ(choice.candidate->rel_path, "step-100/__1_0.distcp");

  // Equal tensor matches: the file's own previous save wins over a newer
  // file of another role (last.ckpt against the epoch files).
  const FileRole epoch = RoleOf("ckpts/epoch=1-step=200.ckpt");
  auto both = MergeBaseCandidates(epoch, {Candidate(4, "ckpts/epoch=0-step=100.ckpt", keys),
                                          Candidate(5, "ckpts/last.ckpt", keys)},
                                  {});
  EXPECT_TRUE(both[0].same_role);
  EXPECT_FALSE(both[1].same_role);
  choice = ChooseBase(both, FileFormat::kTorchZip, keys, 1000, 10);
  ASSERT_NE(choice.candidate, nullptr);
  EXPECT_EQ(choice.candidate->rel_path, "ckpts/epoch=0-step=100.ckpt");
  // More shared tensors still win over the role.
  both[1].tensor_keys.push_back("c|f32|4");
  choice = ChooseBase(both, FileFormat::kTorchZip, {"a|f32|4", "b|f32|4", "c|f32|4"}, 1000, 10);
  EXPECT_EQ(choice.candidate->rel_path, "ckpts/last.ckpt");
  // A version in both lists appears once.
  EXPECT_EQ(MergeBaseCandidates(epoch, {Candidate(4, "ckpts/epoch=0-step=100.ckpt", keys)},
                                {Candidate(4, "ckpts/epoch=0-step=100.ckpt", keys)})
                .size(),
            1u);
}

// A committed checkpoint's reconstruction stays in the chunk cache under
// its blob's id (the next version's encode reads it as its base without
// decoding); a file over half the cache, or an opaque one, does not.
TEST(ReconstructionCache, ACommittedCheckpointIsCachedDecoded) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  const auto v1 = testing::Npy(300000, 3, 0.0f);
  auto first = Commit(*store, "run/ckpt-1.npy", v1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto reader = store->OpenBlob(first->fields.object);
  ASSERT_TRUE(reader.ok());
  ASSERT_GT((*reader)->chunks().size(), 1u);
  for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) {
    const ChunkInfo& info = (*reader)->chunks()[c];
    auto cached = store->chunk_cache()->Get(first->fields.object, c);
    ASSERT_NE(cached, nullptr) << "chunk " << c;
    ASSERT_EQ(cached->size(), info.logical_length);
    EXPECT_TRUE(std::equal(cached->span().begin(), cached->span().end(),
                           v1.begin() + static_cast<ptrdiff_t>(info.logical_offset)))
        << "chunk " << c << " holds the file's bytes";
  }
  // The next version deltas against it and reads back.
  const auto v2 = testing::Npy(300000, 3, 0.01f);
  std::vector<BaseCandidate> bases{*first->as_base};
  auto second = Commit(*store, "run/ckpt-2.npy", v2, {}, bases);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->fields.base, first->fields.object);
  auto second_reader = store->OpenBlob(second->fields.object);
  ASSERT_TRUE(second_reader.ok());
  store->chunk_cache()->Drop(second->fields.object, 0);  // read some of it by decoding
  auto decoded = DecodeAll(**second_reader);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, v2);

  TempDir small_dir;
  StoreOptions small;
  small.chunk_cache_bytes = 1 << 20;  // the file is over half of it
  auto opened = Store::Open(small_dir.path(), small);
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE((*opened)->ClaimStagingArea().ok());
  auto big = Commit(**opened, "ckpt.npy", v1);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*opened)->chunk_cache()->Get(big->fields.object, 0), nullptr);
  const auto opaque = RandomBytes(100000, 9);
  auto plain = Commit(*store, "notes.bin", opaque);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(store->chunk_cache()->Get(plain->fields.object, 0), nullptr);
}

TEST(ContentIndex, IdenticalBytesAreStoredOnce) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  const auto bytes = RandomBytes(50000, 7);
  auto first = Commit(*store, "a/ckpt.pt", bytes);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto copy = Commit(*store, "b/last.ckpt", bytes);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(copy->fields.object, first->fields.object);
  EXPECT_EQ(copy->stats.stored_bytes, 0u);
  EXPECT_EQ(copy->fields.chain_depth, first->fields.chain_depth);
  // Other bytes, or the same bytes under other encoder settings, are not.
  auto other = RandomBytes(50000, 8);
  EXPECT_NE(Commit(*store, "c/x.pt", other)->fields.object, first->fields.object);
  CommitOptions no_dedup;
  no_dedup.dedup = false;
  auto again = Commit(*store, "d/y.pt", bytes, no_dedup);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->stats.stored_bytes, 0u);  // encoded anew (same object: the same blob)
  // Under other encoder settings the content key differs, but a file whose
  // bytes are a blob's reconstruction (here: lossless) still finds it by
  // its exact key, after a byte-for-byte comparison.
  CommitOptions other_settings;
  other_settings.coding = "other";
  auto exact = Commit(*store, "e/z.pt", bytes, other_settings);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->fields.object, first->fields.object);
  EXPECT_EQ(exact->stats.stored_bytes, 0u);
  Layout layout = OpaqueLayout(bytes.size(), "test");
  CommitOptions other_coding;
  other_coding.coding = "trellis=1";
  const FileDigests digests = DigestFile(bytes);
  EXPECT_EQ(digests.id, ObjectId::Of(bytes));
  EXPECT_EQ(digests.checksum, Checksum64(bytes));
  const auto large = RandomBytes((600 << 10) + 7, 3);  // several blocks and a tail
  EXPECT_EQ(DigestFile(large).id, ObjectId::Of(large));
  EXPECT_EQ(DigestFile(large).checksum, Checksum64(large));
  EXPECT_NE(ContentKey(digests, layout, CommitOptions{}, "a/ckpt.pt"),
            ContentKey(digests, layout, other_coding, "a/ckpt.pt"));
}

// A copy committed while the original is still being encoded (Lightning's
// last.ckpt, copied right after the save) waits for it and names its blob,
// instead of encoding the same bytes again (here: as a delta on another
// version, a different blob).
TEST(ContentIndex, ACopyCommittedWhileTheOriginalIsEncodedWaitsForIt) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  auto v0 = RandomBytes(100000, 11);
  auto v1 = v0;
  for (size_t i = 0; i < v1.size(); i += 1000) v1[i] = std::byte{0x7f};
  auto older = Commit(*store, "a/v0.bin", v0);
  ASSERT_TRUE(older.ok() && older->as_base);
  CommitOptions options;
  options.in_flight = std::make_shared<ContentInFlight>();
  const ObjectId key = ContentKey(DigestFile(v1), DetectLayout(v1), options, "b/copy.bin");
  std::optional<ContentInFlight::Claim> original_in_flight(options.in_flight->Acquire(key));
  Result<EncodedVersion> copy = Status::Internal("not run");
  std::thread copier([&] { copy = Commit(*store, "b/copy.bin", v1, options, {*older->as_base}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CommitOptions alone;  // the original's commit (it holds the claim)
  auto original = Commit(*store, "a/v1.bin", v1, alone);
  ASSERT_TRUE(original.ok()) << original.status().ToString();
  original_in_flight.reset();
  copier.join();
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(copy->fields.object, original->fields.object);
  EXPECT_EQ(copy->stats.stored_bytes, 0u);
  // Different content never waits: a claim on another key is independent.
  auto other = options.in_flight->Acquire(ObjectId::Of(v0));
  EXPECT_FALSE(other.waited());
  auto again = Commit(*store, "c/v1.bin", v1, options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->fields.object, original->fields.object);
}

TEST(ContentIndex, StaleAndDamagedEntriesAreIgnoredAndSwept) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  const auto bytes = RandomBytes(50000, 9);
  auto first = Commit(*store, "ckpt.pt", bytes);
  ASSERT_TRUE(first.ok());
  const ObjectId key = ContentKey(DigestFile(bytes), OpaqueLayout(bytes.size(), "test"), CommitOptions{}, "ckpt.pt");
  ASSERT_TRUE(FindIdenticalContent(*store, key, bytes.size(), FileFormat::kOpaque, nullptr).has_value());
  // Wrong size or format: no match.
  EXPECT_FALSE(FindIdenticalContent(*store, key, bytes.size() + 1, FileFormat::kOpaque, nullptr).has_value());
  EXPECT_FALSE(FindIdenticalContent(*store, key, bytes.size(), FileFormat::kNpy, nullptr).has_value());
  // Entry round trip and damage: every changed character is refused.
  ContentEntry e{first->fields.object, 3, FileFormat::kTorchZip, 12345};
  const std::string text = e.EncodeText();
  EXPECT_LE(text.size(), 60u);  // fits in an ext4 inode (a fast symlink)
  auto back = ContentEntry::DecodeText(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->object, e.object);
  EXPECT_EQ(back->chain_depth, 3u);
  EXPECT_EQ(back->format, FileFormat::kTorchZip);
  EXPECT_EQ(back->logical_size, 12345u);
  for (size_t i = 0; i < text.size(); ++i) {
    std::string bad = text;
    bad[i] = bad[i] == '1' ? '2' : '1';
    EXPECT_FALSE(ContentEntry::DecodeText(bad).ok()) << i;
  }
  EXPECT_FALSE(ContentEntry::DecodeText(text.substr(0, text.size() - 1)).ok());
  EXPECT_FALSE(ContentEntry::DecodeText("").ok());
  // The index entry takes no data block.
  struct stat st;
  ASSERT_EQ(::lstat((dir.path() + "/.ckptfs/content/" + key.Hex()).c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  // The file is deleted and GC removes its object: the entry goes, and the
  // same bytes are encoded anew.
  ASSERT_EQ(::unlink((dir.path() + "/ckpt.pt").c_str()), 0);
  GcOptions gc;
  gc.grace_seconds = 0;
  auto report = CollectGarbage(*store, gc, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->removed, 1u);
  EXPECT_EQ(report->removed_content_entries, 2u);  // its content key and its exact key
  EXPECT_FALSE(FindIdenticalContent(*store, key, bytes.size(), FileFormat::kOpaque, nullptr).has_value());
  auto anew = Commit(*store, "ckpt2.pt", bytes);
  ASSERT_TRUE(anew.ok());
  EXPECT_GT(anew->stats.stored_bytes, 0u);
  EXPECT_TRUE(std::filesystem::exists(store->ObjectPath(anew->fields.object)));
}

}  // namespace
}  // namespace ckptfs::fs

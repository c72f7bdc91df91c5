// Delta-base choice (fs/base_candidates.h): a directory's versions as the
// daemon commits them, with its in-memory candidate list. Chains stay
// shorter than `keyframe`; when the newest version's chain is full the next
// one is an anchor frame against the previous anchor, so key frames come
// about every keyframe^2/2 versions; without a known anchor (after a
// remount) the old rule applies.
#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

#include "fs/base_candidates.h"

namespace ckptfs::fs {
namespace {

constexpr size_t kListSize = 4;  // as the daemon's kMaxBaseCandidates

struct Version {
  size_t base = SIZE_MAX;  // index of the base version, SIZE_MAX for a key frame
  uint32_t depth = 0;
  bool anchor = false;
};

ObjectId IdOf(size_t version) {
  ObjectId id;
  id.bytes[0] = static_cast<uint8_t>(version);
  id.bytes[1] = static_cast<uint8_t>(version >> 8);
  return id;
}

size_t VersionOf(const ObjectId& id) { return id.bytes[0] | (size_t{id.bytes[1]} << 8); }

// Commits `count` versions of one checkpoint layout into a directory whose
// candidate list starts as `list`.
std::vector<Version> Commit(size_t count, uint32_t keyframe, std::deque<BaseCandidate> list = {},
                            size_t first = 0) {
  const std::vector<std::string> keys = {"model.w|f32|4x4", "optimizer.state.0.exp_avg|f32|4x4"};
  std::vector<Version> out;
  for (size_t v = first; v < first + count; ++v) {
    const std::vector<BaseCandidate> candidates(list.begin(), list.end());
    const BaseChoice choice = ChooseBase(candidates, FileFormat::kTorchZip, keys, 1000, keyframe);
    Version version;
    if (choice.candidate != nullptr) {
      version.base = VersionOf(choice.candidate->id);
      version.depth = choice.candidate->chain_depth + 1;
    }
    version.anchor = choice.candidate == nullptr || choice.anchor;
    out.push_back(version);
    RememberBaseCandidate(&list, BaseCandidate{IdOf(v), version.depth, FileFormat::kTorchZip, 1000, keys,
                                               version.anchor},
                          kListSize);
  }
  return out;
}

TEST(BaseChoice, AnchorFramesChainAndKeyFramesComeAboutEveryKeyframeSquaredOverTwo) {
  const uint32_t keyframe = 5;
  const std::vector<Version> versions = Commit(40, keyframe);
  std::vector<size_t> keys, first_anchors;
  for (size_t v = 0; v < versions.size(); ++v) {
    const Version& x = versions[v];
    EXPECT_LT(x.depth, keyframe) << "version " << v;
    if (x.base == SIZE_MAX) {
      EXPECT_EQ(x.depth, 0u);
      keys.push_back(v);
    } else if (x.anchor && !versions[x.base].anchor) {
      ADD_FAILURE() << "an anchor frame against a version that is no anchor, version " << v;
    } else if (x.anchor && x.depth == versions[x.base].depth + 1 && x.base + 1 < v && x.base + 4 < v) {
      first_anchors.push_back(v);  // against an anchor beyond the newest four versions
    } else {
      EXPECT_GE(x.base + 4, v) << "a delta frame against one of the newest four versions, version " << v;
    }
  }
  // Key frame 0, versions 1-4 (depths 1-4), 5-7 against version 3 (the
  // newest with room), then anchor frame 8 against the key frame (depth 1),
  // 9-11, 12-14 against 10, anchor 15 against 8 (depth 2), ..., anchor 21
  // against 15 (depth 3), 22-25 against 21 (depth 4, full), key frame 26.
  EXPECT_EQ(keys, (std::vector<size_t>{0, 26})) << "one key frame per 26 versions, not per 8";
  EXPECT_EQ(first_anchors, (std::vector<size_t>{8, 15, 21, 34}));
  EXPECT_EQ(versions[8].base, 0u);
  EXPECT_EQ(versions[15].base, 8u);
  EXPECT_EQ(versions[21].base, 15u);
}

// A directory with two checkpoint files per step (a torch.save file and a
// safetensors file of the weights): each keeps its own anchor chain.
TEST(BaseChoice, EachKindOfFileKeepsItsAnchors) {
  const uint32_t keyframe = 5;
  const std::vector<std::string> torch_keys = {"model.w|f32|4x4", "optimizer.state.0.exp_avg|f32|4x4"};
  const std::vector<std::string> st_keys = {"w|f32|4x4"};
  std::deque<BaseCandidate> list;
  std::vector<size_t> torch_keyframes;
  for (size_t step = 0; step < 40; ++step) {
    for (int kind = 0; kind < 2; ++kind) {
      const FileFormat format = kind == 0 ? FileFormat::kTorchZip : FileFormat::kSafetensors;
      const std::vector<std::string>& keys = kind == 0 ? torch_keys : st_keys;
      const std::vector<BaseCandidate> candidates(list.begin(), list.end());
      const BaseChoice choice = ChooseBase(candidates, format, keys, 1000, keyframe);
      const size_t id = 2 * step + static_cast<size_t>(kind);
      uint32_t depth = 0;
      if (choice.candidate != nullptr) {
        depth = choice.candidate->chain_depth + 1;
        EXPECT_EQ(VersionOf(choice.candidate->id) % 2, static_cast<size_t>(kind)) << "a base of the other kind";
      } else if (kind == 0) {
        torch_keyframes.push_back(step);
      }
      EXPECT_LT(depth, keyframe);
      RememberBaseCandidate(&list, BaseCandidate{IdOf(id), depth, format, 1000, keys,
                                                 choice.candidate == nullptr || choice.anchor},
                            kListSize);
    }
  }
  // Fewer older versions of its kind with room than alone (the list of
  // four holds two of each), so the anchors come sooner: every 18 steps.
  EXPECT_EQ(torch_keyframes, (std::vector<size_t>{0, 18, 36}));
}

TEST(BaseChoice, KeyframeOneAndTwo) {
  for (const Version& x : Commit(6, 1)) EXPECT_EQ(x.base, SIZE_MAX) << "keyframe=1: every version a key frame";
  const std::vector<Version> two = Commit(6, 2);
  for (const Version& x : two) EXPECT_LT(x.depth, 2u);
  EXPECT_EQ(two[0].base, SIZE_MAX);
  EXPECT_EQ(two[1].base, 0u);
  for (size_t v = 2; v <= 4; ++v) {
    EXPECT_EQ(two[v].base, 0u) << "against the key frame while it is among the newest four, version " << v;
    EXPECT_TRUE(two[v].anchor);
  }
  EXPECT_EQ(two[5].base, SIZE_MAX) << "the anchors at depth 1 leave no room";
}

// After a remount the list is scanned from the store: a key frame among the
// newest versions is an anchor, anchor frames are not known as such, so the
// first full chain falls back to the newest version with room while one is
// in the list, then a key frame.
TEST(BaseChoice, WithoutAKnownAnchorOlderVersionsThenAKeyFrame) {
  const std::vector<std::string> keys = {"model.w|f32|4x4", "optimizer.state.0.exp_avg|f32|4x4"};
  std::deque<BaseCandidate> scanned;
  for (uint32_t depth = 1; depth <= 4; ++depth)
    scanned.push_back(BaseCandidate{IdOf(100 + depth), depth + 1, FileFormat::kTorchZip, 1000, keys, false});
  // Depths 2..5 with keyframe 6: the newest (5) is full.
  const std::vector<Version> v = Commit(5, 6, scanned, 200);
  EXPECT_EQ(v[0].base, 103u) << "the newest version with room (depth 4)";
  EXPECT_FALSE(v[0].anchor);
  EXPECT_EQ(v[1].base, 103u);
  EXPECT_EQ(v[2].base, 103u);
  EXPECT_EQ(v[3].base, SIZE_MAX) << "no version with room left: a key frame";
  EXPECT_TRUE(v[3].anchor);
  EXPECT_EQ(v[4].base, 203u) << "then chains as before";
}

TEST(BaseChoice, TheBestMatchWinsOverAnAnchorAndOtherFormatsNeverMatch) {
  const std::vector<std::string> keys = {"a|f32|4", "b|f32|4", "c|f32|4"};
  std::vector<BaseCandidate> c = {
      {IdOf(1), 0, FileFormat::kTorchZip, 1000, {"a|f32|4"}, true},
      {IdOf(2), 3, FileFormat::kTorchZip, 1000, keys, false},
      {IdOf(3), 1, FileFormat::kSafetensors, 1000, keys, false},
  };
  BaseChoice got = ChooseBase(c, FileFormat::kTorchZip, keys, 1000, 10);
  ASSERT_NE(got.candidate, nullptr);
  EXPECT_EQ(VersionOf(got.candidate->id), 2u);
  EXPECT_FALSE(got.anchor);
  // The best match's chain is full: the anchor, though it shares less.
  got = ChooseBase(c, FileFormat::kTorchZip, keys, 1000, 4);
  ASSERT_NE(got.candidate, nullptr);
  EXPECT_EQ(VersionOf(got.candidate->id), 1u);
  EXPECT_TRUE(got.anchor);
  // Sharing nothing is no base.
  got = ChooseBase(c, FileFormat::kTorchZip, {"z|f32|4"}, 1000, 10);
  EXPECT_EQ(got.candidate, nullptr);
}

TEST(BaseChoice, TheListKeepsTheNewestVersionWithAValueSample) {
  // DeepSpeed with six ranks: the model file (a value sample: a ref
  // candidate), then six optimizer files whose weights are its ref copies
  // (no sample). The model file stays in the folder's list for all of them.
  std::deque<BaseCandidate> list;
  BaseCandidate model{IdOf(0), 0, FileFormat::kTorchZip, 1, {"module|f32|4"}, true};
  model.values = std::make_shared<ValueSample>();
  RememberBaseCandidate(&list, model, kListSize);
  for (size_t v = 1; v <= 6; ++v)
    RememberBaseCandidate(&list, BaseCandidate{IdOf(v), 0, FileFormat::kTorchZip, 1, {"flat|f32|4"}, true},
                          kListSize);
  std::vector<size_t> kept;
  for (const BaseCandidate& c : list) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{0, 3, 4, 5, 6}));
  // A newer sample replaces it (6 stays as its kind's newest anchor).
  BaseCandidate next = model;
  next.id = IdOf(7);
  RememberBaseCandidate(&list, next, kListSize);
  for (size_t v = 8; v <= 11; ++v)
    RememberBaseCandidate(&list, BaseCandidate{IdOf(v), 0, FileFormat::kTorchZip, 1, {"flat|f32|4"}, false},
                          kListSize);
  kept.clear();
  for (const BaseCandidate& c : list) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{6, 7, 8, 9, 10, 11}));
}

TEST(BaseChoice, TheListKeepsTheNewestAnchorBesideTheNewestVersions) {
  std::deque<BaseCandidate> list;
  auto add = [&](size_t v, bool anchor) {
    RememberBaseCandidate(&list, BaseCandidate{IdOf(v), 0, FileFormat::kTorchZip, 1, {}, anchor}, kListSize);
  };
  add(0, true);
  for (size_t v = 1; v <= 6; ++v) add(v, false);
  std::vector<size_t> kept;
  for (const BaseCandidate& c : list) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{0, 3, 4, 5, 6}));
  add(7, true);  // a newer anchor: the old one goes
  add(8, false);
  kept.clear();
  for (const BaseCandidate& c : list) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{5, 6, 7, 8}));
  // Another kind of file only from now on: the old kind's anchor (7) goes
  // once none of the newest four is of its kind, and does not hold its
  // chain for ever.
  for (size_t v = 9; v <= 12; ++v)
    RememberBaseCandidate(&list, BaseCandidate{IdOf(v), 0, FileFormat::kTorchZip, 1, {"other|f32|4"}, v == 9},
                          kListSize);
  kept.clear();
  for (const BaseCandidate& c : list) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{9, 10, 11, 12}));
  // Files without tensors are of one kind only at a similar size: a small
  // file's anchor does not push out a large one's.
  std::deque<BaseCandidate> opaque;
  RememberBaseCandidate(&opaque, BaseCandidate{IdOf(20), 0, FileFormat::kOpaque, 1 << 20, {}, true}, kListSize);
  for (size_t v = 21; v <= 26; ++v)
    RememberBaseCandidate(&opaque,
                          BaseCandidate{IdOf(v), 0, FileFormat::kOpaque, v % 2 ? 1000u : (1u << 20), {}, v == 21},
                          kListSize);
  kept.clear();
  for (const BaseCandidate& c : opaque) kept.push_back(VersionOf(c.id));
  EXPECT_EQ(kept, (std::vector<size_t>{20, 21, 23, 24, 25, 26})) << "both sizes' anchors (20, 21) stay";
}

}  // namespace
}  // namespace ckptfs::fs

namespace ckptfs::fs {
namespace {

TEST(ChooseBaseTest, DeltasThatDoNotPayStartANewChain) {
  const std::vector<std::string> keys = {"w|f32|4"};
  auto version = [&](uint8_t id, uint32_t depth, uint64_t stored, uint64_t key) {
    BaseCandidate c{IdOf(id), depth, FileFormat::kTorchZip, 1000, keys, depth == 0, stored, key, /*lossless=*/true};
    return c;
  };
  // A lossy delta (a fifth of its key frame) is a base.
  std::vector<BaseCandidate> paying = {version(1, 0, 1000, 1000), version(2, 1, 200, 1000)};
  ASSERT_NE(ChooseBase(paying, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  EXPECT_EQ(ChooseBase(paying, FileFormat::kTorchZip, keys, 1000, 10, true).candidate->id, IdOf(2));
  // A lossless delta that cost 95 % of its key frame: a key frame next,
  // when versions of the file are being deleted (else deltas still save).
  std::vector<BaseCandidate> not_paying = {version(1, 0, 1000, 1000), version(2, 1, 950, 1000)};
  EXPECT_NE(ChooseBase(not_paying, FileFormat::kTorchZip, keys, 1000, 10, false).candidate, nullptr);
  EXPECT_EQ(ChooseBase(not_paying, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  // ... also when a newer key frame is the best match: the recent delta
  // says deltas of this file do not pay.
  not_paying.push_back(version(3, 0, 1000, 1000));
  EXPECT_EQ(ChooseBase(not_paying, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  // A non-paying delta of another kind of file (fewer shared tensors) does
  // not count.
  std::vector<BaseCandidate> other = {version(1, 0, 1000, 1000), version(2, 1, 950, 1000)};
  other[1].tensor_keys = {"x|f32|4"};
  EXPECT_NE(ChooseBase(other, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  // Lossy deltas are judged by their budget, not by an old key frame's size.
  std::vector<BaseCandidate> lossy = {version(1, 0, 1000, 1000), version(2, 1, 950, 1000)};
  lossy[1].lossless = false;
  EXPECT_NE(ChooseBase(lossy, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  // A key frame itself is always tried as a base; unknown sizes change nothing.
  const std::vector<BaseCandidate> key_only = {version(1, 0, 1000, 1000)};
  EXPECT_NE(ChooseBase(key_only, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
  const std::vector<BaseCandidate> unknown = {version(1, 0, 0, 0), version(2, 1, 950, 0)};
  EXPECT_NE(ChooseBase(unknown, FileFormat::kTorchZip, keys, 1000, 10, true).candidate, nullptr);
}

}  // namespace
}  // namespace ckptfs::fs

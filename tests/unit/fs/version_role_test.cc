// The role of a checkpoint file (fs/version_role.h): the versions of one
// file of a run share it wherever the framework put them; other ranks'
// files, other runs' folders and other files of a save do not.
#include <gtest/gtest.h>

#include <string>

#include "fs/version_role.h"

namespace ckptfs::fs {
namespace {

std::string Key(const std::string& path) { return RoleOf(path).key; }

void ExpectSameRole(const std::string& a, const std::string& b) {
  EXPECT_EQ(Key(a), Key(b)) << a << " vs " << b;
}
void ExpectOtherRole(const std::string& a, const std::string& b) {
  EXPECT_NE(Key(a), Key(b)) << a << " vs " << b;
}

TEST(VersionRole, StepFoldersOfEachFramework) {
  // Hugging Face Trainer, with and without the staging folder.
  ExpectSameRole("out/checkpoint-100/optimizer.pt", "out/checkpoint-200/optimizer.pt");
  ExpectSameRole("out/checkpoint-100/optimizer.pt", "out/tmp-checkpoint-1200/optimizer.pt");
  ExpectSameRole("out/checkpoint-100/model.safetensors", "out/tmp-checkpoint-k2x9_a1b/model.safetensors");
  // Megatron (zero-padded) per tensor-parallel rank, pipeline ranks too.
  ExpectSameRole("iter_0000100/mp_rank_03/model_optim_rng.pt", "iter_0000200/mp_rank_03/model_optim_rng.pt");
  ExpectSameRole("iter_0000100/mp_rank_01_002/model_optim_rng.pt", "iter_0001000/mp_rank_01_002/model_optim_rng.pt");
  // DeepSpeed, also nested in a Trainer's folder (both numbers change).
  ExpectSameRole("global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                 "global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  ExpectSameRole("run/checkpoint-100/global_step100/mp_rank_00_model_states.pt",
                 "run/checkpoint-200/global_step200/mp_rank_00_model_states.pt");
  // torchtitan / DCP shards, Lightning's sharded folders.
  ExpectSameRole("checkpoint/step-100/__0_0.distcp", "checkpoint/step-600/__0_0.distcp");
  ExpectSameRole("ckpts/epoch=0-step=100.ckpt/__1_0.distcp", "ckpts/epoch=2-step=900.ckpt/__1_0.distcp");
  // Lightning's one-folder names, Hugging Face shards.
  ExpectSameRole("ckpts/epoch=3-step=1200.ckpt", "ckpts/epoch=4-step=1500.ckpt");
  ExpectSameRole("ckpts/epoch=3-step=1200-v1.ckpt", "ckpts/epoch=4-step=1500-v2.ckpt");
  ExpectSameRole("checkpoint-5/model-00002-of-00003.safetensors", "checkpoint-10/model-00002-of-00003.safetensors");
  // DCP's metadata staged as .metadata.tmp; a safetensors temp name.
  ExpectSameRole("step-100/.metadata.tmp", "step-200/.metadata");
  ExpectSameRole("w/.tmpAbC123", "w/.tmpZz9y8X");
}

TEST(VersionRole, OtherRanksRunsAndFilesDoNotMatch) {
  ExpectOtherRole("iter_0000100/mp_rank_00/model_optim_rng.pt", "iter_0000100/mp_rank_01/model_optim_rng.pt");
  ExpectOtherRole("iter_0000100/mp_rank_00/model_optim_rng.pt", "iter_0000200/mp_rank_01/model_optim_rng.pt");
  ExpectOtherRole("global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                  "global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  ExpectOtherRole("step-100/__0_0.distcp", "step-100/__1_0.distcp");
  ExpectOtherRole("step-100/__0_0.distcp", "step-200/__0_1.distcp");
  ExpectOtherRole("checkpoint-5/model-00001-of-00003.safetensors", "checkpoint-5/model-00002-of-00003.safetensors");
  ExpectOtherRole("checkpoint-100/rng_state_0.pth", "checkpoint-100/rng_state_1.pth");
  // Two runs in sibling folders: only the deepest numbered folder is the step.
  ExpectOtherRole("runs/run1/checkpoint-100/optimizer.pt", "runs/run2/checkpoint-200/optimizer.pt");
  ExpectOtherRole("seed0/ckpt-000100.pt", "seed1/ckpt-000100.pt");
  // Other files of one save.
  ExpectOtherRole("checkpoint-100/optimizer.pt", "checkpoint-100/scheduler.pt");
  ExpectOtherRole("ckpts/last.ckpt", "ckpts/epoch=0-step=100.ckpt");
  // A folder above the step that does not carry the step's number stays.
  ExpectOtherRole("exp_lr3/checkpoint-100/optimizer.pt", "exp_lr4/checkpoint-200/optimizer.pt");
}

TEST(VersionRole, RankBlindKeyGroupsTheRanksOfOneSave) {
  EXPECT_EQ(RoleOf("step-100/__0_0.distcp").rank_blind, RoleOf("step-100/__3_0.distcp").rank_blind);
  EXPECT_EQ(RoleOf("iter_0000100/mp_rank_00/model_optim_rng.pt").rank_blind,
            RoleOf("iter_0000100/mp_rank_07/model_optim_rng.pt").rank_blind);
  EXPECT_NE(RoleOf("ckpts/last.ckpt").rank_blind, RoleOf("ckpts/epoch=0-step=100.ckpt").rank_blind);
}

TEST(VersionRole, PatternsSayWhichComponentsAreMatchedByName) {
  FileRole r = RoleOf("run1/checkpoint-100/global_step100/mp_rank_00/f.pt");
  ASSERT_EQ(r.pattern.size(), 5u);
  EXPECT_FALSE(r.pattern[0]);  // run1: another run's folder never matches
  EXPECT_TRUE(r.pattern[1]);   // carries the step number of global_step100
  EXPECT_TRUE(r.pattern[2]);   // the step folder
  EXPECT_FALSE(r.pattern[3]);  // a rank folder
  EXPECT_FALSE(r.pattern[4]);  // f.pt has no number
  EXPECT_EQ(r.text[0], "run1");
  EXPECT_EQ(r.text[2], NormalizeComponent("global_step200"));
  EXPECT_EQ(RoleOf("").key, "");
  EXPECT_EQ(RoleOf("plain.bin").key, "plain.bin");
}

TEST(VersionRole, NormalizedNames) {
  EXPECT_EQ(NormalizeComponent("mp_rank_03"), "mp_rank_03");
  EXPECT_EQ(NormalizeComponent("iter_0000100"), NormalizeComponent("iter_9"));
  EXPECT_EQ(NormalizeComponent("tmp-checkpoint-100"), NormalizeComponent("checkpoint-7"));
  EXPECT_EQ(NormalizeComponent("model.bin.tmp"), "model.bin");
  EXPECT_NE(NormalizeComponent("step"), NormalizeComponent("step1"));
  // Digits inside a word that only ends like a rank word ("step" ends in
  // "ep") are steps.
  EXPECT_EQ(NormalizeComponent("global_step100"), NormalizeComponent("global_step5"));
  EXPECT_EQ(ComponentNumbers("epoch=3-step=1200-v1.ckpt"), (std::vector<unsigned long long>{3, 1200, 1}));
  EXPECT_EQ(ComponentNumbers("x99999999999999999999999").size(), 1u);  // saturates, no overflow trap
}

}  // namespace
}  // namespace ckptfs::fs

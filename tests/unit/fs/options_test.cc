#include "fs/options.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "fs/staging_placement.h"

namespace ckptfs::fs {
namespace {

TEST(MountOptionsTest, ParsesOwnOptionsAndPassesFuseOnes) {
  MountOptions o;
  ASSERT_TRUE(ParseMountOptionList("compress=off,threads=4,keyframe=5,cache=64,zstd=7,loglevel=warn,"
                                   "log=/var/log/x,crash_at=after_objects,gc_grace=10,allow_other,"
                                   "default_permissions,defaults,_netdev",
                                   &o)
                  .ok());
  EXPECT_FALSE(o.compress);
  EXPECT_EQ(o.threads, 4u);
  EXPECT_EQ(o.keyframe, 5u);
  EXPECT_EQ(o.cache_mib, 64u);
  EXPECT_EQ(o.zstd_level, 7);
  EXPECT_EQ(o.log_level, LogLevel::kWarn);
  EXPECT_EQ(o.log_file, "/var/log/x");
  EXPECT_EQ(o.crash_at, "after_objects");
  EXPECT_EQ(o.gc_grace_seconds, 10);
  EXPECT_EQ(o.fuse_options, (std::vector<std::string>{"allow_other", "default_permissions"}));
}

TEST(MountOptionsTest, RejectsUnknownAndMalformedOptions) {
  for (const char* bad : {"bogus", "threads=0", "threads=x", "compress=maybe", "crash_at=nowhere",
                          "loglevel=loud", "keyframe=", "keyframe=129", "allow_other=1", "zstd=99"}) {
    MountOptions o;
    Status s = ParseMountOptionList(bad, &o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(MountOptionsTest, LevelsAreAppliedFirstAndRefinedByTheOtherOptions) {
  MountOptions plain;
  EXPECT_EQ(plain.level, "default");
  MountOptions o;
  // budget= before level= still wins over the preset's budget.
  ASSERT_TRUE(ParseMountOptionList("budget=0.02,level=max", &o).ok());
  EXPECT_EQ(o.level, "max");
  EXPECT_DOUBLE_EQ(o.budget, 0.02);
  EXPECT_TRUE(o.low_rank_moments);
  EXPECT_EQ(o.keyframe, 20u);
  MountOptions l;
  ASSERT_TRUE(ParseMountOptionList("level=lossless", &l).ok());
  EXPECT_FALSE(l.lossy);
  MountOptions s;
  ASSERT_TRUE(ParseMountOptionList("level=safe", &s).ok());
  EXPECT_TRUE(s.lossy);
  EXPECT_DOUBLE_EQ(s.budget, 0.003);
  EXPECT_DOUBLE_EQ(s.opt_budget, 0.05);
  for (const Preset& p : kPresets) {  // every preset parses and names itself
    MountOptions each;
    ASSERT_TRUE(ParseMountOptionList("level=" + std::string(p.name), &each).ok()) << p.name;
    EXPECT_EQ(each.level, p.name);
  }
  MountOptions c;
  ASSERT_TRUE(ParseMountOptionList("level=compact", &c).ok());
  EXPECT_DOUBLE_EQ(c.budget, 0.02);
  EXPECT_EQ(c.keyframe, 20u);
  EXPECT_FALSE(c.low_rank_moments);
  MountOptions bad;
  const Status refused = ParseMountOptionList("level=fast", &bad);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  for (const Preset& p : kPresets)  // the error lists every level
    EXPECT_NE(refused.message().find(std::string(p.name)), std::string::npos) << refused.message();
}

TEST(StagingPlacementTest, AutoIsTheStoreOnALocalDiskAndADirectoryInsideTheStoreIsRefused) {
  const std::string backing = std::filesystem::temp_directory_path().string();
  ASSERT_FALSE(IsSharedFilesystem(backing)) << "the test's temp directory should be on a local filesystem";
  std::string why;
  MountOptions o;
  auto r = ResolveStaging(o, backing, &why);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "");  // in the store
  EXPECT_NE(why.find("local"), std::string::npos);
  o.staging = "/elsewhere/staging/";
  r = ResolveStaging(o, backing, &why);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "/elsewhere/staging");
  o.staging = backing + "/sub";
  EXPECT_EQ(ResolveStaging(o, backing, &why).status().code(), StatusCode::kInvalidArgument);
  o.staging = "store";
  r = ResolveStaging(o, backing, &why);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "");
}

TEST(MountOptionsTest, StagingTakesAutoStoreOrAnAbsoluteDirectory) {
  MountOptions o;
  EXPECT_EQ(o.staging, "auto");
  ASSERT_TRUE(ParseMountOptionList("staging=/local/ssd", &o).ok());
  EXPECT_EQ(o.staging, "/local/ssd");
  ASSERT_TRUE(ParseMountOptionList("staging=store", &o).ok());
  EXPECT_EQ(o.staging, "store");
  for (const char* bad : {"staging=", "staging=relative/dir"}) {
    MountOptions b;
    EXPECT_EQ(ParseMountOptionList(bad, &b).code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ckptfs::fs

namespace ckptfs::fs {
namespace {

TEST(MountOptionsTest, LossyOptionsBuildThePolicy) {
  MountOptions o;
  EXPECT_TRUE(o.lossy);  // lossy by default
  ASSERT_TRUE(ParseMountOptionList("budget=0.02,opt_budget=0.1,gpu=off", &o).ok());
  EXPECT_EQ(o.budget, 0.02);
  EXPECT_EQ(o.opt_budget, 0.1);
  EXPECT_EQ(o.gpu, lossy::GpuMode::kOff);
  EXPECT_EQ(o.schedule.kind, lossy::BudgetSchedule::Kind::kDsq);  // on by default
  ASSERT_TRUE(ParseMountOptionList("schedule=off", &o).ok());
  EXPECT_FALSE(o.schedule.enabled());
  ASSERT_TRUE(ParseMountOptionList("schedule=dsq", &o).ok());
  EXPECT_EQ(o.schedule.kind, lossy::BudgetSchedule::Kind::kDsq);
  EXPECT_EQ(o.schedule.update_fraction, lossy::BudgetSchedule{}.update_fraction);
  // update_fraction= holds whichever side of schedule= it is given.
  ASSERT_TRUE(ParseMountOptionList("update_fraction=0.7,schedule=dsq", &o).ok());
  EXPECT_EQ(o.schedule.update_fraction, 0.7);
  ASSERT_TRUE(ParseMountOptionList("schedule=dsq,update_fraction=1.5", &o).ok());
  EXPECT_EQ(o.schedule.update_fraction, 1.5);
  for (const char* bad : {"update_fraction=0", "update_fraction=-1", "update_fraction=5", "update_fraction=x"}) {
    MountOptions b;
    EXPECT_EQ(ParseMountOptionList(bad, &b).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(o.low_rank_moments) << "off by default (docs/policy.md)";
  ASSERT_TRUE(ParseMountOptionList("low_rank=off", &o).ok());
  EXPECT_FALSE(o.low_rank_moments);
  ASSERT_TRUE(ParseMountOptionList("low_rank=on", &o).ok());
  EXPECT_TRUE(o.low_rank_moments);
  EXPECT_FALSE(ParseMountOptionList("low_rank=2", &o).ok());
  EXPECT_FALSE(o.trellis) << "off by default (docs/policy.md)";
  ASSERT_TRUE(ParseMountOptionList("trellis=on", &o).ok());
  EXPECT_TRUE(o.trellis);
  ASSERT_TRUE(ParseMountOptionList("trellis=off", &o).ok());
  EXPECT_FALSE(o.trellis);
  EXPECT_FALSE(ParseMountOptionList("trellis=yes", &o).ok());
  EXPECT_EQ(o.momentum_dither, kMomentumDitherByDefault);
  ASSERT_TRUE(ParseMountOptionList("momentum_dither=0.9", &o).ok());
  EXPECT_EQ(o.momentum_dither, 0.9);
  ASSERT_TRUE(ParseMountOptionList("momentum_dither=0", &o).ok());
  EXPECT_EQ(o.momentum_dither, 0.0);
  for (const char* bad : {"momentum_dither=-0.1", "momentum_dither=2.5", "momentum_dither=x"}) {
    MountOptions b;
    EXPECT_EQ(ParseMountOptionList(bad, &b).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(o.step_prediction);  // on by default
  ASSERT_TRUE(ParseMountOptionList("predict=off", &o).ok());
  EXPECT_FALSE(o.step_prediction);
  ASSERT_TRUE(ParseMountOptionList("predict=on", &o).ok());
  EXPECT_TRUE(o.step_prediction);
  EXPECT_TRUE(o.momentum_step_space);  // step space by default
  ASSERT_TRUE(ParseMountOptionList("momentum=plain", &o).ok());
  EXPECT_FALSE(o.momentum_step_space);
  ASSERT_TRUE(ParseMountOptionList("momentum=step", &o).ok());
  EXPECT_TRUE(o.momentum_step_space);
  EXPECT_EQ(ParseMountOptionList("momentum=steps", &o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMountOptionList("momentum_budget=2", &o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMountOptionList("momentum_budget=0", &o).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(ParseMountOptionList("momentum_budget=0.3", &o).ok());
  EXPECT_EQ(o.momentum_budget, 0.3);
  EXPECT_EQ(ParseMountOptionList("denominator_budget=1.5", &o).code(), StatusCode::kInvalidArgument);
  Result<std::shared_ptr<const policy::Policy>> p = BuildLossyPolicy(o);
  ASSERT_TRUE(p.ok());
  TensorInfo w{"model.w", DType::kF32, {4}, false};
  TensorInfo m{"optimizer.state.0.exp_avg", DType::kF32, {4}, false};
  TensorInfo v{"optimizer.state.0.exp_avg_sq", DType::kF32, {4}, false};
  EXPECT_EQ((*p)->BudgetFor("a.pt", FileFormat::kTorchZip, w).rel_l2, 0.02);
  EXPECT_EQ((*p)->BudgetFor("a.pt", FileFormat::kTorchZip, m).rel_l2, 0.1);
  EXPECT_DOUBLE_EQ((*p)->BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.225) << "2.25 times opt_budget";
  ASSERT_TRUE(ParseMountOptionList("denominator_budget=0.3", &o).ok());
  EXPECT_EQ(o.denominator_budget, 0.3);
  p = BuildLossyPolicy(o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.3);

  ASSERT_TRUE(ParseMountOptionList("lossy=off", &o).ok());
  p = BuildLossyPolicy(o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->BudgetFor("a.pt", FileFormat::kTorchZip, w).rel_l2, 0.0);

  for (const char* bad : {"budget=-0.1", "budget=2", "budget=x", "opt_budget=", "gpu=maybe", "lossy=perhaps",
                          "policy=", "schedule=", "schedule=fast", "predict=maybe"}) {
    MountOptions b;
    EXPECT_FALSE(ParseMountOptionList(bad, &b).ok()) << bad;
  }
  MountOptions missing;
  ASSERT_TRUE(ParseMountOptionList("policy=/nonexistent/policy.toml", &missing).ok());
  EXPECT_FALSE(BuildLossyPolicy(missing).ok());
}

}  // namespace
}  // namespace ckptfs::fs

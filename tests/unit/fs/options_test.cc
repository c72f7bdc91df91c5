#include "fs/options.h"

#include <gtest/gtest.h>

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
                          "loglevel=loud", "keyframe=", "allow_other=1", "zstd=99"}) {
    MountOptions o;
    Status s = ParseMountOptionList(bad, &o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ckptfs::fs

#include "codec/common/replacement_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "codec/common/io.h"

namespace ckptfs {
namespace {

namespace stdfs = std::filesystem;

class ReplacementFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckptfs-replace-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { stdfs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Read(const std::string& path) const {
    auto bytes = ReadWholeFile(path);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    return bytes.ok() ? std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()) : "";
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : stdfs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string dir_;
};

ByteSpan Text(const std::string& s) { return AsBytes(s); }

Status ReplaceWholeFile(const std::string& path, ByteSpan data) {
  ASSIGN_OR_RETURN(ReplacementFile out, ReplacementFile::Create(path));
  RETURN_IF_ERROR(out.Append(data));
  return out.Commit();
}

TEST_F(ReplacementFileTest, OldBytesStayUntilTheCommit) {
  ASSERT_TRUE(WriteWholeFile(Path("out"), Text("old contents")).ok());
  {
    auto file = ReplacementFile::Create(Path("out"));
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    ASSERT_TRUE(file->Append(Text("new ")).ok());
    ASSERT_TRUE(file->Append(Text("bytes")).ok());
    EXPECT_EQ(Read(Path("out")), "old contents");
    EXPECT_EQ(Names().size(), 2u);  // the new file beside it
    ASSERT_TRUE(file->Commit().ok());
  }
  EXPECT_EQ(Read(Path("out")), "new bytes");
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});
}

TEST_F(ReplacementFileTest, WithoutACommitNothingChanges) {
  ASSERT_TRUE(WriteWholeFile(Path("out"), Text("old contents")).ok());
  {
    auto file = ReplacementFile::Create(Path("out"));
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE(file->Append(Text("half of a decod")).ok());
  }  // a failed decode returns here
  EXPECT_EQ(Read(Path("out")), "old contents");
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});
  {
    auto file = ReplacementFile::Create(Path("fresh"));
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE(file->Append(Text("x")).ok());
  }
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});
}

TEST_F(ReplacementFileTest, ANewFileIsAnOrdinaryFile) {
  const mode_t old_mask = ::umask(022);
  ASSERT_TRUE(ReplaceWholeFile(Path("made"), Text("abc")).ok());
  ::umask(old_mask);
  struct stat st;
  ASSERT_EQ(::stat(Path("made").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(Read(Path("made")), "abc");
}

TEST_F(ReplacementFileTest, ALinksTargetIsReplacedAndTheLinkStays) {
  ASSERT_TRUE(WriteWholeFile(Path("target"), Text("old")).ok());
  ASSERT_EQ(::symlink("target", Path("link").c_str()), 0);
  {
    auto file = ReplacementFile::Create(Path("link"));
    ASSERT_TRUE(file.ok());
    EXPECT_TRUE(file->replaces());
    ASSERT_TRUE(file->Append(Text("half")).ok());
  }  // failed: the file the link points to is as it was
  EXPECT_EQ(Read(Path("target")), "old");
  ASSERT_TRUE(ReplaceWholeFile(Path("link"), Text("through the link")).ok());
  EXPECT_TRUE(stdfs::is_symlink(Path("link")));
  EXPECT_EQ(Read(Path("target")), "through the link");
  EXPECT_EQ(Names(), (std::vector<std::string>{"link", "target"}));
  // A dangling link is written through: its target is made.
  ASSERT_EQ(::symlink("made-by-link", Path("dangling").c_str()), 0);
  ASSERT_TRUE(ReplaceWholeFile(Path("dangling"), Text("new")).ok());
  EXPECT_EQ(Read(Path("made-by-link")), "new");
}

TEST_F(ReplacementFileTest, TheOldFilesModeIsKept) {
  ASSERT_TRUE(WriteWholeFile(Path("private"), Text("old")).ok());
  ASSERT_EQ(::chmod(Path("private").c_str(), 0600), 0);
  ASSERT_TRUE(ReplaceWholeFile(Path("private"), Text("new")).ok());
  struct stat st;
  ASSERT_EQ(::stat(Path("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(Read(Path("private")), "new");
}

TEST_F(ReplacementFileTest, AHardLinkedFileIsWrittenInPlace) {
  // Its other names must see the new bytes: written into it, as O_TRUNC did.
  ASSERT_TRUE(WriteWholeFile(Path("out"), Text("old")).ok());
  ASSERT_EQ(::link(Path("out").c_str(), Path("other-name").c_str()), 0);
  auto file = ReplacementFile::Create(Path("out"));
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(file->replaces());
  ASSERT_TRUE(file->Append(Text("new")).ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(Read(Path("other-name")), "new");
  EXPECT_EQ(Names(), (std::vector<std::string>{"other-name", "out"}));
}

TEST_F(ReplacementFileTest, WritesIntoADevice) {
  // /dev/null is written, never replaced.
  auto null = ReplacementFile::Create("/dev/null");
  ASSERT_TRUE(null.ok()) << null.status().ToString();
  ASSERT_TRUE(null->Append(Text("discarded")).ok());
  EXPECT_FALSE(null->replaces());
  ASSERT_TRUE(null->Commit().ok());
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST_F(ReplacementFileTest, ADirectoryIsAClearError) {
  ASSERT_TRUE(stdfs::create_directory(Path("d")));
  auto file = ReplacementFile::Create(Path("d"));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().ToString().find(Path("d")), std::string::npos) << file.status().ToString();
  EXPECT_FALSE(ReplacementFile::Create(dir_ + "/").ok());
  EXPECT_FALSE(ReplacementFile::Create(Path("missing-dir/out")).ok());
}

}  // namespace
}  // namespace ckptfs

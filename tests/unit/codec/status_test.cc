#include "codec/common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "codec/common/hash.h"

namespace ckptfs {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return Status::InvalidArgument("odd value, want even have " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  ASSIGN_OR_RETURN(int h, Half(v));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, ResultCarriesValueOrError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().ToString(), "InvalidArgument: odd value, want even have 3");
}

TEST(StatusTest, IoMapsErrno) {
  EXPECT_EQ(Status::Io(ENOSPC, "write").code(), StatusCode::kNoSpace);
  EXPECT_EQ(Status::Io(EIO, "write").code(), StatusCode::kIo);
  EXPECT_EQ(Status::Io(EIO, "write").sys_errno(), EIO);
  EXPECT_EQ(Status::Corruption("x").WithContext("chunk 3").message(), "chunk 3: x");
}

TEST(HashTest, ObjectIdHexRoundTripAndRejectsBadHex) {
  ObjectId id = ObjectId::Of(AsBytes("hello"));
  auto back = ObjectId::FromHex(id.Hex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_FALSE(ObjectId::FromHex("../../etc/passwd").ok());
  EXPECT_FALSE(ObjectId::FromHex(std::string(32, 'A')).ok());
  EXPECT_FALSE(ObjectId::FromHex(std::string(31, 'a')).ok());
}

TEST(HashTest, Crc32MatchesZlibReference) {
  // CRC-32 of "123456789" is 0xCBF43926 (the standard check value).
  EXPECT_EQ(Crc32(AsBytes("123456789")), 0xCBF43926u);
  Checksum64Stream s;
  s.Update(AsBytes("1234"));
  s.Update(AsBytes("56789"));
  EXPECT_EQ(s.Digest(), Checksum64(AsBytes("123456789")));
}

TEST(HashTest, ObjectIdStreamMatchesOneShot) {
  std::string text(5000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 23);
  ObjectIdStream s;
  s.Update(AsBytes(std::string_view(text).substr(0, 1234)));
  s.Update(AsBytes(std::string_view(text).substr(1234)));
  EXPECT_EQ(s.Digest(), ObjectId::Of(AsBytes(text)));
  EXPECT_NE(s.Digest(), ObjectId::Of(AsBytes(std::string_view(text).substr(1))));
}

}  // namespace
}  // namespace ckptfs

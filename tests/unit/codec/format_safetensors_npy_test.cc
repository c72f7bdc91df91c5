// safetensors and .npy parsing on files built here, including the malformed
// ones the brief names: bad JSON, huge header length, lying ranges and
// shapes, unsupported dtypes.
#include <gtest/gtest.h>

#include "codec/format/layout.h"
#include "codec/format/npy.h"
#include "codec/format/safetensors.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {

using testing::Bytes;
using testing::IsOpaque;
using testing::Summaries;

std::vector<std::byte> Safetensors(std::string_view json, size_t buffer_size, uint64_t claimed_length = ~0ull) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.U64(claimed_length == ~0ull ? json.size() : claimed_length);
  w.Bytes(AsBytes(json));
  w.Zeros(buffer_size);
  return out;
}

void ExpectOpaqueWithReason(const std::vector<std::byte>& file, std::string_view want) {
  Layout layout = DetectLayout(file);
  EXPECT_TRUE(IsOpaque(layout, file.size()));
  EXPECT_NE(layout.fallback_reason.find(want), std::string::npos) << layout.fallback_reason << " / want: " << want;
}

TEST(SafetensorsTest, ParsesTensorsGapsAndUnknownDtypes) {
  // Tensors out of order, a 4-byte gap, a dtype we do not know and trailing
  // bytes: coverage stays exact, the unknown one stays verbatim.
  std::string json =
      R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[12,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("q":{"dtype":"Q4","shape":[3],"data_offsets":[16,19]},)"
      R"("__metadata__":{"k":"v"}})";
  std::vector<std::byte> file = Safetensors(json, 24);
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kSafetensors) << layout.fallback_reason;
  ASSERT_TRUE(ValidateLayout(layout, file.size()).ok());
  EXPECT_EQ(Summaries(layout), (std::vector<std::string>{"a f32 [2]", "b f16 [2]"}));
  uint64_t buffer = 8 + json.size();
  ASSERT_EQ(layout.segments.size(), 5u);  // header, a, gap, b, rest (q + tail)
  EXPECT_EQ(layout.segments[0].length, buffer);
  EXPECT_EQ(layout.segments[1].offset, buffer);
  EXPECT_TRUE(layout.segments[1].is_tensor());
  EXPECT_FALSE(layout.segments[2].is_tensor());
  EXPECT_EQ(layout.segments[3].offset, buffer + 12);
  EXPECT_FALSE(layout.segments[4].is_tensor());
}

TEST(SafetensorsTest, MalformedHeadersAreOpaqueWithReason) {
  std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(DetectLayout(Safetensors(one, 8)).format, FileFormat::kSafetensors);
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32",,}})", 8), "JSON");
  ExpectOpaqueWithReason(Safetensors(R"({"a": [1,2]})", 8), "not an object");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "want 12");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "outside");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "outside");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     8),
                         "overlap");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8), "shape");
  ExpectOpaqueWithReason(
      Safetensors(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8), "shape");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), "lacks");
  // Metadata may hold nested values, but never deeply nested ones.
  ExpectOpaqueWithReason(Safetensors(R"({"__metadata__":{"k":[[[[[[1]]]]]]},)"
                                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                     8),
                         "deeper");
  ExpectOpaqueWithReason(Safetensors(R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8), "shape");
}

TEST(SafetensorsTest, HeaderLengthLimits) {
  std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ParseLimits tight;
  tight.max_json_header = 16;
  auto parsed = ParseSafetensors(Safetensors(one, 8), tight);
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  // A length past the end of the file does not even look like safetensors;
  // the parser itself says why.
  std::vector<std::byte> huge = Safetensors(one, 8, 1ull << 40);
  EXPECT_TRUE(IsOpaque(DetectLayout(huge), huge.size()));
  EXPECT_EQ(ParseSafetensors(huge, ParseLimits{}).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> past = Safetensors(one, 8, one.size() + 100);
  EXPECT_EQ(ParseSafetensors(past, ParseLimits{}).status().code(), StatusCode::kCorruption);
}

TEST(SafetensorsTest, DtypeNames) {
  EXPECT_EQ(SafetensorsDType("BF16"), DType::kBF16);
  EXPECT_EQ(SafetensorsDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(SafetensorsDType("C64"), DType::kC64);
  EXPECT_EQ(SafetensorsDType("f32"), DType::kUnknown);
}

std::vector<std::byte> Npy(std::string_view dict, size_t data_size, uint8_t major = 1) {
  std::vector<std::byte> out = Bytes("\x93NUMPY");
  ByteWriter w(&out);
  w.U8(major);
  w.U8(0);
  if (major == 1) {
    w.U16(static_cast<uint16_t>(dict.size()));
  } else {
    w.U32(static_cast<uint32_t>(dict.size()));
  }
  w.Bytes(AsBytes(dict));
  w.Zeros(data_size);
  return out;
}

TEST(NpyTest, ParsesHeaders) {
  auto h = ParseNpyHeader(Npy("{'descr': '>i2', 'fortran_order': True, 'shape': (3, 4,), }\n", 24));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->dtype, DType::kI16);
  EXPECT_TRUE(h->big_endian);
  EXPECT_TRUE(h->fortran_order);
  EXPECT_EQ(h->shape, (std::vector<uint64_t>{3, 4}));
  std::vector<std::byte> file = Npy("{\"descr\": \"<c8\", \"fortran_order\": False, \"shape\": (2L,)}", 16, 2);
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kNpy) << layout.fallback_reason;
  EXPECT_EQ(Summaries(layout), (std::vector<std::string>{"array c64 [2]"}));
  // One-byte types are never flagged big-endian (there is nothing to swap).
  EXPECT_FALSE(ParseNpyHeader(Npy("{'descr': '|u1', 'fortran_order': False, 'shape': ()}", 1))->big_endian);
}

TEST(NpyTest, EmptyArrayHasNoTensor) {
  std::vector<std::byte> file = Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0);
  Layout layout = DetectLayout(file);
  EXPECT_EQ(layout.format, FileFormat::kNpy);
  EXPECT_TRUE(layout.tensors.empty());
  EXPECT_TRUE(ValidateLayout(layout, file.size()).ok());
}

TEST(NpyTest, MalformedOrUnsupportedIsOpaqueWithReason) {
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 23), "want 24");
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 25), "want 24");
  ExpectOpaqueWithReason(Npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16), "not handled");
  ExpectOpaqueWithReason(Npy("{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8), "structured");
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'shape': (2,), }", 8), "lacks");
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", 8), "fortran_order");
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "unknown key");
  ExpectOpaqueWithReason(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8, 7), "version");
  ExpectOpaqueWithReason(
      Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8), "dimension");
  ExpectOpaqueWithReason(
      Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8), "overflow");
}

}  // namespace
}  // namespace ckptfs

// Helpers shared by the format tests: fixture loading and layout summaries.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <cstring>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/format/layout.h"

namespace ckptfs::testing {

inline std::string FormatsDir() { return std::string(CKPTFS_SOURCE_DIR) + "/tests/data/formats"; }

inline std::vector<std::byte> ReadFixture(const std::string& name) {
  std::ifstream in(FormatsDir() + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

inline std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// "name dtype [d0,d1]" per tensor, sorted, for order-free comparison.
inline std::vector<std::string> Summaries(const Layout& layout) {
  std::vector<std::string> out;
  for (const TensorInfo& t : layout.tensors) {
    std::ostringstream s;
    s << t.name << " " << DTypeName(t.dtype) << " [";
    for (size_t i = 0; i < t.shape.size(); ++i) s << (i ? "," : "") << t.shape[i];
    s << "]";
    out.push_back(s.str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline bool IsOpaque(const Layout& layout, uint64_t size) {
  return layout.format == FileFormat::kOpaque && layout.tensors.empty() && ValidateLayout(layout, size).ok() &&
         layout.segments.size() == (size > 0 ? 1u : 0u);
}

}  // namespace ckptfs::testing

#include "codec/format/safetensors.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "codec/format/segments.h"

namespace ckptfs {
namespace {

constexpr uint64_t kLengthPrefix = 8;
constexpr int kMaxJsonDepth = 4;

struct NamedDType {
  std::string_view name;
  DType dtype;
};
constexpr NamedDType kSafetensorsDTypes[] = {
    {"F64", DType::kF64},         {"F32", DType::kF32},         {"F16", DType::kF16},  {"BF16", DType::kBF16},
    {"I64", DType::kI64},         {"I32", DType::kI32},         {"I16", DType::kI16},  {"I8", DType::kI8},
    {"U64", DType::kU64},         {"U32", DType::kU32},         {"U16", DType::kU16},  {"U8", DType::kU8},
    {"BOOL", DType::kBool},       {"F8_E4M3", DType::kF8E4M3},  {"F8_E5M2", DType::kF8E5M2},
    {"C64", DType::kC64},         {"C128", DType::kC128},
};

// A JSON value as an unsigned integer, if it is one.
bool AsU64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// A JSON value for an error message; never throws on odd strings.
std::string Show(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool LooksLikeSafetensors(ByteSpan file) {
  if (file.size() < kLengthPrefix + 2) return false;
  uint64_t n = LoadLE64(file.data());
  return n >= 2 && n <= file.size() - kLengthPrefix && file[kLengthPrefix] == std::byte{'{'};
}

DType SafetensorsDType(std::string_view name) {
  for (const NamedDType& d : kSafetensorsDTypes)
    if (d.name == name) return d.dtype;
  return DType::kUnknown;
}

Result<Layout> ParseSafetensors(ByteSpan file, const ParseLimits& limits) {
  if (file.size() < kLengthPrefix)
    return Status::Corruption(fmt::format("safetensors: {} bytes, shorter than the length prefix", file.size()));
  uint64_t n = LoadLE64(file.data());
  if (n > limits.max_json_header)
    return Status::InvalidArgument(
        fmt::format("safetensors: header length {} over the limit {}", n, limits.max_json_header));
  if (n > file.size() - kLengthPrefix)
    return Status::Corruption(
        fmt::format("safetensors: header length {} past the file end, have {} bytes", n, file.size() - kLengthPrefix));
  std::string_view text = AsChars(file.subspan(kLengthPrefix, n));
  // A valid header nests only a few levels (object, entry, shape array);
  // deeper values are dropped while parsing so that a hostile header cannot
  // build a huge tree, and their presence makes the header invalid.
  bool too_deep = false;
  auto limit_depth = [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return depth <= kMaxJsonDepth;
  };
  nlohmann::json header = nlohmann::json::parse(text.begin(), text.end(), limit_depth, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return Status::Corruption("safetensors: header is not a JSON object");
  if (too_deep)
    return Status::Corruption(fmt::format("safetensors: header nests deeper than {} levels", kMaxJsonDepth));

  const uint64_t buffer_start = kLengthPrefix + n;
  const uint64_t buffer_size = file.size() - buffer_start;
  Layout layout;
  layout.format = FileFormat::kSafetensors;
  std::vector<Segment> tensor_segments;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (layout.tensors.size() >= limits.max_tensors)
      return Status::InvalidArgument(fmt::format("safetensors: more than {} tensors", limits.max_tensors));
    if (!entry.is_object()) return Status::Corruption(fmt::format("safetensors: entry {} is not an object", name));
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string() || shape_it == entry.end() || !shape_it->is_array() ||
        offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      return Status::Corruption(fmt::format("safetensors: entry {} lacks dtype, shape or data_offsets", name));
    uint64_t begin = 0;
    uint64_t end = 0;
    if (!AsU64((*offsets_it)[0], &begin) || !AsU64((*offsets_it)[1], &end) || begin > end || end > buffer_size)
      return Status::Corruption(
          fmt::format("safetensors: entry {} has data_offsets {} outside the {}-byte buffer", name,
                      Show(*offsets_it), buffer_size));
    TensorInfo info;
    info.name = name;
    info.dtype = SafetensorsDType(dtype_it->get<std::string>());
    uint64_t elements = 1;
    for (const nlohmann::json& d : *shape_it) {
      uint64_t dim = 0;
      if (!AsU64(d, &dim) || __builtin_mul_overflow(elements, dim, &elements))
        return Status::Corruption(fmt::format("safetensors: entry {} has a bad shape {}", name, Show(*shape_it)));
      info.shape.push_back(dim);
    }
    uint64_t elem = DTypeSize(info.dtype);
    uint64_t want = 0;
    if (elem != 0 && (__builtin_mul_overflow(elements, elem, &want) || want != end - begin))
      return Status::Corruption(fmt::format("safetensors: entry {} holds {} bytes, want {} for shape {} of {}", name,
                                            end - begin, want, Show(*shape_it), dtype_it->get<std::string>()));
    // Unknown dtypes and empty tensors keep their (checked) bytes verbatim;
    // the range still goes through the overlap check.
    int32_t index = -1;
    if (elem != 0 && end > begin) {
      index = static_cast<int32_t>(layout.tensors.size());
      layout.tensors.push_back(std::move(info));
    }
    tensor_segments.push_back(Segment{buffer_start + begin, end - begin, index});
  }
  auto segments = CoverWithVerbatim(std::move(tensor_segments), file.size());
  if (!segments.ok()) return segments.status().WithContext("safetensors");
  // Checked ranges of unknown dtype were only placeholders: make them verbatim
  // and merge neighbouring verbatim segments so none is split needlessly.
  for (const Segment& s : *segments) {
    if (!layout.segments.empty() && !s.is_tensor() && !layout.segments.back().is_tensor()) {
      layout.segments.back().length += s.length;
    } else {
      layout.segments.push_back(s);
    }
  }
  return layout;
}

}  // namespace ckptfs

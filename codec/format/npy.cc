#include "codec/format/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "codec/format/segments.h"

namespace ckptfs {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMaxDims = 64;

// A tiny reader for the Python literal numpy writes: a flat dict of string
// keys to strings, booleans and tuples of integers.
class LiteralReader {
 public:
  explicit LiteralReader(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  std::optional<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    char quote = text_[pos_++];
    size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool Word(std::string_view w) {
    SkipSpace();
    if (text_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  std::optional<uint64_t> Integer() {
    SkipSpace();
    size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, uint64_t(text_[pos_] - '0'), &v))
        return std::nullopt;
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long
    return v;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

Status BadHeader(std::string_view why) { return Status::Corruption(fmt::format("npy: header {}", why)); }

// descr such as '<f4', '|b1', '>i8'.
Status ParseDescr(const std::string& descr, NpyHeader* h) {
  if (descr.size() < 3) return Status::Unsupported(fmt::format("npy: dtype '{}' not handled", descr));
  char order = descr[0];
  char kind = descr[1];
  std::string_view size_text = std::string_view(descr).substr(2);
  if ((order != '<' && order != '>' && order != '|' && order != '=') ||
      !std::all_of(size_text.begin(), size_text.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return Status::Unsupported(fmt::format("npy: dtype '{}' not handled", descr));
  std::string code = std::string(1, kind) + std::string(size_text);
  struct Code {
    std::string_view code;
    DType dtype;
  };
  static constexpr Code kCodes[] = {
      {"f2", DType::kF16}, {"f4", DType::kF32}, {"f8", DType::kF64},  {"i1", DType::kI8},    {"i2", DType::kI16},
      {"i4", DType::kI32}, {"i8", DType::kI64}, {"u1", DType::kU8},   {"u2", DType::kU16},   {"u4", DType::kU32},
      {"u8", DType::kU64}, {"b1", DType::kBool}, {"c8", DType::kC64}, {"c16", DType::kC128},
  };
  for (const Code& c : kCodes)
    if (c.code == code) h->dtype = c.dtype;
  if (h->dtype == DType::kUnknown) return Status::Unsupported(fmt::format("npy: dtype '{}' not handled", descr));
  // '=' is native order, which numpy only writes on the machine that reads it
  // back; ckptfs runs little-endian.
  h->big_endian = order == '>' && DTypeSize(h->dtype) > 1;
  return Status::Ok();
}

Status ParseDict(std::string_view text, NpyHeader* h) {
  LiteralReader r(text);
  if (!r.Eat('{')) return BadHeader("does not start with '{'");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!r.Eat('}')) {
    std::optional<std::string> key = r.String();
    if (!key || !r.Eat(':')) return BadHeader("has a malformed key");
    if (*key == "descr") {
      if (r.Peek('[')) return Status::Unsupported("npy: structured dtype not handled");
      std::optional<std::string> descr = r.String();
      if (!descr) return BadHeader("'descr' is not a string");
      RETURN_IF_ERROR(ParseDescr(*descr, h));
      have_descr = true;
    } else if (*key == "fortran_order") {
      if (r.Word("True")) {
        h->fortran_order = true;
      } else if (!r.Word("False")) {
        return BadHeader("'fortran_order' is not True or False");
      }
      have_order = true;
    } else if (*key == "shape") {
      if (!r.Eat('(')) return BadHeader("'shape' is not a tuple");
      while (!r.Eat(')')) {
        std::optional<uint64_t> dim = r.Integer();
        if (!dim || h->shape.size() >= kMaxDims) return BadHeader("'shape' has a bad dimension");
        h->shape.push_back(*dim);
        if (!r.Eat(',') && !r.Peek(')')) return BadHeader("'shape' is malformed");
      }
      have_shape = true;
    } else {
      return BadHeader(fmt::format("has an unknown key '{}'", *key));
    }
    if (!r.Eat(',') && !r.Peek('}')) return BadHeader("has a malformed entry separator");
  }
  if (!r.AtEnd()) return BadHeader("has bytes after the dict");
  if (!have_descr || !have_order || !have_shape) return BadHeader("lacks descr, fortran_order or shape");
  return Status::Ok();
}

}  // namespace

bool LooksLikeNpy(ByteSpan file) { return AsChars(file).starts_with(kMagic); }

Result<NpyHeader> ParseNpyHeader(ByteSpan file) {
  ByteReader r(file, "npy preamble");
  r.Skip(kMagic.size());
  uint8_t major = r.U8();
  uint8_t minor = r.U8();
  RETURN_IF_ERROR(r.status());
  if (minor != 0 || major < 1 || major > 3)
    return Status::Unsupported(fmt::format("npy: version {}.{}, want 1.0, 2.0 or 3.0", major, minor));
  uint64_t length = major == 1 ? r.U16() : r.U32();
  std::string_view text = AsChars(r.Bytes(length));
  RETURN_IF_ERROR(r.status());
  NpyHeader h;
  h.data_offset = r.position();
  RETURN_IF_ERROR(ParseDict(text, &h));
  return h;
}

Result<Layout> ParseNpy(ByteSpan file) {
  ASSIGN_OR_RETURN(NpyHeader h, ParseNpyHeader(file));
  uint64_t bytes = DTypeSize(h.dtype);
  for (uint64_t d : h.shape)
    if (__builtin_mul_overflow(bytes, d, &bytes)) return Status::Corruption("npy: shape byte size overflows");
  uint64_t have = file.size() - h.data_offset;
  if (bytes != have)
    return Status::Corruption(fmt::format("npy: data is {} bytes, want {} for the shape", have, bytes));
  Layout layout;
  layout.format = FileFormat::kNpy;
  std::vector<Segment> tensor_segments;
  if (bytes > 0) {
    TensorInfo info{"array", h.dtype, h.shape, h.big_endian};
    if (h.fortran_order) std::reverse(info.shape.begin(), info.shape.end());
    layout.tensors.push_back(std::move(info));
    tensor_segments.push_back(Segment{h.data_offset, bytes, 0});
  }
  ASSIGN_OR_RETURN(layout.segments, CoverWithVerbatim(std::move(tensor_segments), file.size()));
  return layout;
}

}  // namespace ckptfs

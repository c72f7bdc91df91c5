// Little-endian load/store helpers and a bounds-checked reader over a byte
// span. Every on-disk structure is decoded through ByteReader so that no
// length is used before it has been checked.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/common/status.h"

namespace ckptfs {

using ByteSpan = std::span<const std::byte>;
using MutableByteSpan = std::span<std::byte>;

inline ByteSpan AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string_view AsChars(ByteSpan b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Little-endian loads and stores as one memcpy (a plain move on a
// little-endian host): the element loops of the codec call these per
// element, and a byte-by-byte form kept them from being vectorized.
inline uint16_t LoadLE16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap16(v);
  return v;
}
inline uint32_t LoadLE32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
inline uint64_t LoadLE64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline void StoreLE16(std::byte* p, uint16_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap16(v);
  std::memcpy(p, &v, sizeof v);
}
inline void StoreLE32(std::byte* p, uint32_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  std::memcpy(p, &v, sizeof v);
}
inline void StoreLE64(std::byte* p, uint64_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  std::memcpy(p, &v, sizeof v);
}

// Appends little-endian fields to a growable buffer.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(std::byte(v)); }
  void U16(uint16_t v) { Grow(2, [&](std::byte* p) { StoreLE16(p, v); }); }
  void U32(uint32_t v) { Grow(4, [&](std::byte* p) { StoreLE32(p, v); }); }
  void U64(uint64_t v) { Grow(8, [&](std::byte* p) { StoreLE64(p, v); }); }
  void Bytes(ByteSpan b) { out_->insert(out_->end(), b.begin(), b.end()); }
  void Zeros(size_t n) { out_->resize(out_->size() + n, std::byte{0}); }
  size_t size() const { return out_->size(); }

 private:
  template <typename F>
  void Grow(size_t n, F&& store) {
    size_t at = out_->size();
    out_->resize(at + n);
    store(out_->data() + at);
  }
  std::vector<std::byte>* out_;
};

// Reads little-endian fields from a span, checking bounds. After the first
// failed read, ok() is false and every later read returns zeros, so a decoder
// can read a whole structure and check once (`what` names it in the error).
class ByteReader {
 public:
  ByteReader(ByteSpan data, std::string_view what) : data_(data), what_(what) {}

  uint8_t U8() { return Need(1) ? static_cast<uint8_t>(data_[pos_++]) : 0; }
  uint16_t U16() { return Take<uint16_t>(2, LoadLE16); }
  uint32_t U32() { return Take<uint32_t>(4, LoadLE32); }
  uint64_t U64() { return Take<uint64_t>(8, LoadLE64); }
  // A sub-span of n bytes (empty on failure).
  ByteSpan Bytes(uint64_t n) {
    if (!Need(n)) return {};
    ByteSpan s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  void Skip(uint64_t n) { (void)Bytes(n); }

  bool ok() const { return ok_; }
  size_t position() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  // Corruption status naming the structure and where it ran out, or OK.
  Status status() const;

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > data_.size() - pos_) {
      if (ok_) failed_at_ = pos_, failed_need_ = n;
      ok_ = false;
      return false;
    }
    return true;
  }
  template <typename T, typename L>
  T Take(size_t n, L load) {
    if (!Need(n)) return 0;
    T v = load(data_.data() + pos_);
    pos_ += n;
    return v;
  }

  ByteSpan data_;
  std::string_view what_;
  size_t pos_ = 0;
  bool ok_ = true;
  size_t failed_at_ = 0;
  uint64_t failed_need_ = 0;
};

}  // namespace ckptfs

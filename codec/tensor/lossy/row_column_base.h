// A row-column base for an update denominator's key frame (FORMAT.md
// "Row-column base"): v_ij ~ 2^((G + R_i + C_j) / 8).
//
// Why: Adam's second moment of a matrix is close to an outer product (the
// observation behind Adafactor): log2 v_ij is a row's level plus a
// column's plus a small remainder. The log mode (LOSSY.md section 9) codes
// a key frame's indices against one origin, at the entropy of the whole
// spread of log2 v (about 3 bits per element at one level per octave on a
// character LM); coded as a delta frame against this base it pays for the
// remainder only (about 2.2 bits early in training, 1.3 later), plus a
// byte per row and column.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/tensor/lossy/base_slices.h"

namespace ckptfs::lossy {

// The block: G as a little-endian i32, then R_0..R_{rows-1} and
// C_0..C_{columns-1} as i8, all in eighths of an octave.
inline uint64_t RowColumnBlockSize(uint64_t rows, uint64_t columns) { return 4 + rows + columns; }

// Fits the block to the f32 chunk `values` (rows of `columns` elements):
// the mean of log2 over each row's finite positive elements, then over
// each column's of what the rows leave, rounded to eighths (the log2 is
// read off the float's bits, piecewise linear: the same on every machine).
// nullopt when no element is finite and positive.
std::optional<std::vector<std::byte>> FitRowColumnBase(ByteSpan values, uint64_t columns);
// The same without the vector kernel (same bytes; tests compare the two).
std::optional<std::vector<std::byte>> FitRowColumnBasePortable(ByteSpan values, uint64_t columns);

// The base of `block` for a chunk of `elements` f32 elements in rows of
// `columns`, computed slice by slice (BaseSlices) by the same kernel as
// SynthesizeRowColumnBase: the same bits.
class RowColumnBaseSlices final : public BaseSlices {
 public:
  // Nothing when the sizes disagree. `block` must outlive the object.
  static std::optional<RowColumnBaseSlices> Open(ByteSpan block, uint64_t columns, uint64_t elements,
                                                 bool vector = true);
  uint64_t elements() const override { return elements_; }
  void Fill(uint64_t first, uint64_t count, std::byte* out) const override;

 private:
  RowColumnBaseSlices(int32_t global, const int8_t* row, const int8_t* column, uint64_t columns, uint64_t elements,
                      bool vector)
      : global_(global), row_(row), column_(column), columns_(columns), elements_(elements), vector_(vector) {}
  int32_t global_;
  const int8_t* row_;
  const int8_t* column_;
  uint64_t columns_;
  uint64_t elements_;
  bool vector_;  // the AVX2 kernel where the CPU has it
};

// Writes the base of `block` into `out` (f32, rows * columns elements):
// element (i, j) is 2^(e / 8) for e = G + R_i + C_j clamped to
// [-126 * 8, 127 * 8 + 7], computed as the float nearest 2^((e mod 8) / 8)
// times 2^floor(e / 8), exact. false when the sizes disagree.
bool SynthesizeRowColumnBase(ByteSpan block, uint64_t columns, MutableByteSpan out);
// The same without the vector kernel (same bits; tests compare the two).
bool SynthesizeRowColumnBasePortable(ByteSpan block, uint64_t columns, MutableByteSpan out);

}  // namespace ckptfs::lossy

#include "codec/tensor/lossy/row_column_base.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/common/simd_level.h"

namespace ckptfs::lossy {
namespace {

// The float nearest 2^(k / 8), k = 0..7.
constexpr float kEighths[8] = {0x1p+0f,          0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                               0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};
constexpr int64_t kLowest = -126 * 8;
constexpr int64_t kHighest = 127 * 8 + 7;

// log2 x for a finite x > 0, linear between powers of two: exponent plus
// mantissa - 1 (exact in binary64 from the bits; denormals scaled first).
double Log2Linear(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  double shift = 0;
  if ((bits >> 23) == 0) {  // denormal: scale by 2^32 (exact)
    bits = std::bit_cast<uint32_t>(x * 0x1p32f);
    shift = 32;
  }
  const int exponent = static_cast<int>(bits >> 23) - 127;
  return exponent + static_cast<double>(bits & 0x7fffff) * 0x1p-23 - shift;
}

int8_t Eighths(double octaves) { return static_cast<int8_t>(std::clamp(std::nearbyint(8 * octaves), -127.0, 127.0)); }

}  // namespace

namespace {

// The sums below add log2 values (less a row's offset in eighths): integer
// multiples of 2^-23 below 2^9 in magnitude. Up to kExactSumElements of
// them every partial sum is such a multiple below 2^53 * 2^-23, which
// binary64 holds exactly: the sums are exact in any order, so the vector
// kernel (lanes summed apart, then together) gives the portable loop's
// bits. Larger chunks take the portable loop.
constexpr uint64_t kExactSumElements = uint64_t{1} << 21;

struct RowColumnSums {
  std::vector<double> row_sum, column_sum;
  std::vector<uint64_t> row_count, column_count;
};

bool Log2At(ByteSpan values, uint64_t i, double* out) {
  const float x = std::bit_cast<float>(LoadLE32(values.data() + 4 * i));
  if (!std::isfinite(x) || !(x > 0)) return false;
  *out = Log2Linear(x);
  return true;
}

// The rows' sums of log2 over columns [from, columns) (the portable loop).
void AddRowsPortable(ByteSpan values, uint64_t rows, uint64_t columns, uint64_t from, RowColumnSums* s) {
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = from; c < columns; ++c) {
      double l;
      if (!Log2At(values, r * columns + c, &l)) continue;
      s->row_sum[r] += l;
      ++s->row_count[r];
    }
}

// The columns' sums of log2 less each row's offset, columns [from, columns).
void AddColumnsPortable(ByteSpan values, uint64_t rows, uint64_t columns, uint64_t from,
                        const std::vector<double>& row_offset, RowColumnSums* s) {
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = from; c < columns; ++c) {
      double l;
      if (!Log2At(values, r * columns + c, &l)) continue;
      s->column_sum[c] += l - row_offset[r];
      ++s->column_count[c];
    }
}

#if defined(__x86_64__)
// Log2Linear of eight floats as two vectors of four doubles, and which of
// them are finite and positive (as 64-bit lane masks, and their count).
struct Log2Lanes {
  __m256d lo, hi;        // 0 where not valid
  __m256d valid_lo, valid_hi;
  __m256i valid32;
};
__attribute__((target("avx2"), always_inline)) inline Log2Lanes Log2Eight(const std::byte* at) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
  // Finite and > 0: the sign clear, not +0, below the infinity's bits.
  const __m256i valid = _mm256_and_si256(_mm256_cmpgt_epi32(bits, _mm256_setzero_si256()),
                                         _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), bits));
  // Denormals are scaled by 2^32 first (exact), their exponent 32 lower.
  const __m256i denormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), bits);
  const __m256i scaled = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p32f)));
  const __m256i b = _mm256_blendv_epi8(bits, scaled, denormal);
  const __m256i exponent = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_srli_epi32(b, 23), _mm256_set1_epi32(127)),
                                            _mm256_and_si256(denormal, _mm256_set1_epi32(32)));
  const __m256i mantissa = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffff));
  const __m256d step = _mm256_set1_pd(0x1p-23);
  Log2Lanes out;
  out.valid32 = valid;
  out.valid_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(valid)));
  out.valid_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(valid, 1)));
  const __m256d lo = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(exponent)),
                                   _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(mantissa)), step));
  const __m256d hi = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(exponent, 1)),
                                   _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(mantissa, 1)), step));
  out.lo = _mm256_and_pd(lo, out.valid_lo);
  out.hi = _mm256_and_pd(hi, out.valid_hi);
  return out;
}

__attribute__((target("avx2"))) uint64_t AddRowsAvx2(ByteSpan values, uint64_t rows, uint64_t columns,
                                                     RowColumnSums* s) {
  const uint64_t whole = columns - columns % 8;
  for (uint64_t r = 0; r < rows; ++r) {
    const std::byte* row = values.data() + 4 * r * columns;
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    uint64_t count = 0;
    for (uint64_t c = 0; c < whole; c += 8) {
      const Log2Lanes l = Log2Eight(row + 4 * c);
      a = _mm256_add_pd(a, l.lo);
      b = _mm256_add_pd(b, l.hi);
      count += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(l.valid32)))));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(a, b));
    s->row_sum[r] += (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    s->row_count[r] += count;
  }
  return whole;
}

__attribute__((target("avx2"))) uint64_t AddColumnsAvx2(ByteSpan values, uint64_t rows, uint64_t columns,
                                                        const std::vector<double>& row_offset, RowColumnSums* s) {
  const uint64_t whole = columns - columns % 8;
  for (uint64_t r = 0; r < rows; ++r) {
    const std::byte* row = values.data() + 4 * r * columns;
    const __m256d offset = _mm256_set1_pd(row_offset[r]);
    for (uint64_t c = 0; c < whole; c += 8) {
      const Log2Lanes l = Log2Eight(row + 4 * c);
      double* sum = s->column_sum.data() + c;
      _mm256_storeu_pd(sum, _mm256_add_pd(_mm256_loadu_pd(sum), _mm256_and_pd(_mm256_sub_pd(l.lo, offset), l.valid_lo)));
      _mm256_storeu_pd(sum + 4,
                       _mm256_add_pd(_mm256_loadu_pd(sum + 4), _mm256_and_pd(_mm256_sub_pd(l.hi, offset), l.valid_hi)));
      auto* count = reinterpret_cast<__m256i*>(s->column_count.data() + c);
      // A valid lane's mask is -1: subtracting it counts one.
      _mm256_storeu_si256(count, _mm256_sub_epi64(_mm256_loadu_si256(count), _mm256_castpd_si256(l.valid_lo)));
      _mm256_storeu_si256(count + 1,
                          _mm256_sub_epi64(_mm256_loadu_si256(count + 1), _mm256_castpd_si256(l.valid_hi)));
    }
  }
  return whole;
}
#endif

std::optional<std::vector<std::byte>> Fit(ByteSpan values, uint64_t columns, bool vector) {
  const uint64_t n = values.size() / 4;
  if (columns == 0 || n % columns != 0) return std::nullopt;
  const uint64_t rows = n / columns;
  vector = vector && n <= kExactSumElements;
  RowColumnSums s{std::vector<double>(rows), std::vector<double>(columns), std::vector<uint64_t>(rows),
                  std::vector<uint64_t>(columns)};
  uint64_t from = 0;
#if defined(__x86_64__)
  if (vector) from = AddRowsAvx2(values, rows, columns, &s);
#else
  (void)vector;
#endif
  AddRowsPortable(values, rows, columns, from, &s);
  double total = 0;
  uint64_t count = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    total += s.row_sum[r];
    count += s.row_count[r];
  }
  if (count == 0) return std::nullopt;
  const double mean = total / static_cast<double>(count);
  const int32_t global = static_cast<int32_t>(std::clamp(std::nearbyint(8 * mean), -2e9, 2e9));
  std::vector<int8_t> row_eighths(rows);
  std::vector<double> row_offset(rows);
  for (uint64_t r = 0; r < rows; ++r) {
    row_eighths[r] =
        s.row_count[r] == 0 ? 0 : Eighths(s.row_sum[r] / static_cast<double>(s.row_count[r]) - global / 8.0);
    row_offset[r] = (global + row_eighths[r]) / 8.0;
  }
  from = 0;
#if defined(__x86_64__)
  if (vector) from = AddColumnsAvx2(values, rows, columns, row_offset, &s);
#endif
  AddColumnsPortable(values, rows, columns, from, row_offset, &s);
  std::vector<std::byte> block(RowColumnBlockSize(rows, columns));
  StoreLE32(block.data(), static_cast<uint32_t>(global));
  for (uint64_t r = 0; r < rows; ++r) block[4 + r] = std::byte(static_cast<uint8_t>(row_eighths[r]));
  for (uint64_t c = 0; c < columns; ++c)
    block[4 + rows + c] = std::byte(static_cast<uint8_t>(
        s.column_count[c] == 0 ? 0 : Eighths(s.column_sum[c] / static_cast<double>(s.column_count[c]))));
  return block;
}

}  // namespace

std::optional<std::vector<std::byte>> FitRowColumnBase(ByteSpan values, uint64_t columns) {
  static const bool avx2 = CpuHasSimd(SimdLevel::kAvx2);
  return Fit(values, columns, avx2);
}

std::optional<std::vector<std::byte>> FitRowColumnBasePortable(ByteSpan values, uint64_t columns) {
  return Fit(values, columns, false);
}

namespace {

// One row's elements c in [from, columns): e = clamp(sum + column[c]).
void SynthesizeRowPortable(int32_t sum, const int8_t* column, uint64_t from, uint64_t columns, std::byte* at) {
  for (uint64_t c = from; c < columns; ++c) {
    const int32_t e = std::clamp<int32_t>(sum + column[c], kLowest, kHighest);
    // e >> 3 is floor(e / 8) and e & 7 its remainder, negative e included.
    // ldexp(kEighths[e & 7], e >> 3) is a normal float for every e in
    // [kLowest, kHighest] (its exponent in [-126, 127]): the eighth's bits
    // with e >> 3 added to the exponent field, exactly.
    const uint32_t eighth = std::bit_cast<uint32_t>(kEighths[e & 7]);
    StoreLE32(at + 4 * c, eighth + static_cast<uint32_t>((e >> 3) * (int32_t{1} << 23)));
  }
}

#if defined(__x86_64__)
// SynthesizeRowPortable 8 lanes wide: the eighths are one register
// (a permute), the exponent a shift. Same bits.
__attribute__((target("avx2"))) uint64_t SynthesizeRowAvx2(int32_t sum, const int8_t* column, uint64_t columns,
                                                           std::byte* at) {
  __m256i table;
  std::memcpy(&table, kEighths, sizeof table);
  const __m256i lo = _mm256_set1_epi32(static_cast<int32_t>(kLowest));
  const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(kHighest));
  const __m256i seven = _mm256_set1_epi32(7);
  const __m256i s = _mm256_set1_epi32(sum);
  uint64_t c = 0;
  for (; c + 8 <= columns; c += 8) {
    const __m256i col = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(column + c)));
    const __m256i e = _mm256_max_epi32(lo, _mm256_min_epi32(hi, _mm256_add_epi32(s, col)));
    const __m256i eighth = _mm256_permutevar8x32_epi32(table, _mm256_and_si256(e, seven));
    const __m256i bits = _mm256_add_epi32(eighth, _mm256_slli_epi32(_mm256_srai_epi32(e, 3), 23));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + 4 * c), bits);
  }
  return c;
}
#endif

}  // namespace

std::optional<RowColumnBaseSlices> RowColumnBaseSlices::Open(ByteSpan block, uint64_t columns, uint64_t elements,
                                                             bool vector) {
  if (columns == 0 || elements % columns != 0 || block.size() != RowColumnBlockSize(elements / columns, columns))
    return std::nullopt;
  const uint64_t rows = elements / columns;
  // Clamped first (row and column add at most 256 in size): the sums below
  // stay in int32 and clamp to the same e as unbounded ones would.
  const int32_t global =
      static_cast<int32_t>(std::clamp<int64_t>(static_cast<int32_t>(LoadLE32(block.data())), kLowest - 512, kHighest + 512));
  const auto* row = reinterpret_cast<const int8_t*>(block.data() + 4);
#if defined(__x86_64__)
  static const bool avx2 = CpuHasSimd(SimdLevel::kAvx2);
  vector = vector && avx2;
#else
  vector = false;
#endif
  return RowColumnBaseSlices(global, row, row + rows, columns, elements, vector);
}

void RowColumnBaseSlices::Fill(uint64_t first, uint64_t count, std::byte* out) const {
  // Row by row; a slice may start and end inside a row.
  for (uint64_t at = first; at < first + count;) {
    const uint64_t r = at / columns_;
    const uint64_t from = at % columns_;
    const uint64_t n = std::min(columns_ - from, first + count - at);
    const int32_t sum = global_ + row_[r];
    std::byte* dst = out + 4 * (at - first);
    uint64_t done = 0;
#if defined(__x86_64__)
    if (vector_) done = SynthesizeRowAvx2(sum, column_ + from, n, dst);
#endif
    SynthesizeRowPortable(sum, column_ + from, done, n, dst);
    at += n;
  }
}

namespace {

bool Synthesize(ByteSpan block, uint64_t columns, MutableByteSpan out, bool vector) {
  const std::optional<RowColumnBaseSlices> base = RowColumnBaseSlices::Open(block, columns, out.size() / 4, vector);
  if (!base || out.size() % 4 != 0) return false;
  base->Fill(0, base->elements(), out.data());
  return true;
}

}  // namespace

bool SynthesizeRowColumnBase(ByteSpan block, uint64_t columns, MutableByteSpan out) {
  static const bool avx2 = CpuHasSimd(SimdLevel::kAvx2);
  return Synthesize(block, columns, out, avx2);
}

bool SynthesizeRowColumnBasePortable(ByteSpan block, uint64_t columns, MutableByteSpan out) {
  return Synthesize(block, columns, out, false);
}

}  // namespace ckptfs::lossy

#include "codec/tensor/lossy/low_rank.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace ckptfs::lossy {
namespace {

// The dequantized factors of a block: A[k * rows + i], B[k * columns + j].
struct Factors {
  std::vector<double> a, b;
};

bool Dequantize(ByteSpan block, uint64_t rows, uint64_t columns, uint32_t rank, Factors* f) {
  const std::byte* p = block.data();
  std::vector<double> scale_a(rank), scale_b(rank);
  for (uint32_t k = 0; k < rank; ++k) scale_a[k] = std::bit_cast<float>(LoadLE32(p + 4 * k));
  for (uint32_t k = 0; k < rank; ++k) scale_b[k] = std::bit_cast<float>(LoadLE32(p + 4 * (rank + k)));
  for (uint32_t k = 0; k < rank; ++k)
    if (!std::isfinite(scale_a[k]) || !std::isfinite(scale_b[k])) return false;
  const auto* qa = reinterpret_cast<const int8_t*>(p + 8 * uint64_t{rank});
  const auto* qb = qa + rank * rows;
  f->a.resize(rank * rows);
  f->b.resize(rank * columns);
  for (uint32_t k = 0; k < rank; ++k) {
    for (uint64_t i = 0; i < rows; ++i) f->a[k * rows + i] = scale_a[k] * static_cast<double>(qa[k * rows + i]);
    for (uint64_t j = 0; j < columns; ++j)
      f->b[k * columns + j] = scale_b[k] * static_cast<double>(qb[k * columns + j]);
  }
  return true;
}

// Quantizes `x` to i8 with one scale (max |x| / 127, stored as f32).
float QuantizeFactor(const std::vector<double>& x, int8_t* q) {
  double max_abs = 0;
  for (double v : x) max_abs = std::max(max_abs, std::fabs(v));
  const float scale = static_cast<float>(max_abs / 127.0);
  if (!(scale > 0) || !std::isfinite(scale)) {
    std::fill(q, q + x.size(), int8_t{0});
    return 0.0f;
  }
  for (size_t i = 0; i < x.size(); ++i)
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / scale), -127.0, 127.0));
  return scale;
}

double SumSquares(const double* x, uint64_t n) {
  double s = 0;
  for (uint64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

double SumSquares(const std::vector<double>& x) { return SumSquares(x.data(), x.size()); }

// res += sign * (sa * ka) (sb * kb)^T, as the decoder dequantizes a component.
void AddComponent(double* res, uint64_t rows, uint64_t columns, double sign, float sa, const int8_t* ka, float sb,
                  const int8_t* kb) {
  for (uint64_t i = 0; i < rows; ++i) {
    const double ai = sign * (static_cast<double>(sa) * static_cast<double>(ka[i]));
    double* row = res + i * columns;
    for (uint64_t j = 0; j < columns; ++j) row[j] += ai * (static_cast<double>(sb) * static_cast<double>(kb[j]));
  }
}

}  // namespace

uint64_t LowRankBlockSize(uint64_t rows, uint64_t columns, uint32_t rank) {
  if (rank == 0 || rank > kMaxLowRank || rows == 0 || columns == 0) return 0;
  if (rows > (UINT64_MAX >> 8) || columns > (UINT64_MAX >> 8) - rows) return 0;
  return uint64_t{rank} * (8 + rows + columns);
}

bool AddLowRank(ByteSpan block, uint64_t rows, uint64_t columns, uint32_t rank, MutableByteSpan p) {
  Factors f;
  if (!Dequantize(block, rows, columns, rank, &f)) return false;
  std::byte* out = p.data();
  for (uint64_t i = 0; i < rows; ++i) {
    for (uint64_t j = 0; j < columns; ++j) {
      double term = 0;
      for (uint32_t k = 0; k < rank; ++k) term += f.a[k * rows + i] * f.b[k * columns + j];
      std::byte* at = out + 4 * (i * columns + j);
      const float sum = static_cast<float>(static_cast<double>(std::bit_cast<float>(LoadLE32(at))) + term);
      if (std::isfinite(sum)) StoreLE32(at, std::bit_cast<uint32_t>(sum));
    }
  }
  return true;
}

LowRankFit FitLowRank(double* res, uint64_t rows, uint64_t columns, uint32_t max_rank) {
  LowRankFit fit;
  max_rank = std::min<uint32_t>(max_rank, kMaxLowRank);
  fit.energy_left.push_back(SumSquares(res, rows * columns));
  std::vector<double> u(rows), v(columns);
  for (uint32_t k = 0; k < max_rank; ++k) {
    // Power iteration for the top singular pair of what is left, from a
    // fixed uneven start (no structured matrix is orthogonal to it in
    // practice); only +, *, / and sqrt, so every machine fits the same.
    for (uint64_t j = 0; j < columns; ++j) v[j] = 1.0 + static_cast<double>((j * 37 + k * 11) % 17) / 17.0;
    double sigma = 0;
    for (int it = 0; it < 8; ++it) {
      std::fill(u.begin(), u.end(), 0.0);
      for (uint64_t i = 0; i < rows; ++i) {
        const double* row = res + i * columns;
        double s = 0;
        for (uint64_t j = 0; j < columns; ++j) s += row[j] * v[j];
        u[i] = s;
      }
      const double un = std::sqrt(SumSquares(u));
      if (!(un > 0)) break;
      for (double& x : u) x /= un;
      std::fill(v.begin(), v.end(), 0.0);
      for (uint64_t i = 0; i < rows; ++i) {
        const double* row = res + i * columns;
        for (uint64_t j = 0; j < columns; ++j) v[j] += row[j] * u[i];
      }
      sigma = std::sqrt(SumSquares(v));
      if (!(sigma > 0)) break;
      for (double& x : v) x /= sigma;
    }
    if (!(sigma > 0) || !std::isfinite(sigma)) break;
    for (double& x : u) x *= sigma;
    std::vector<int8_t> ka(rows), kb(columns);
    const float sa = QuantizeFactor(u, ka.data());
    const float sb = QuantizeFactor(v, kb.data());
    if (!(sa > 0) || !(sb > 0)) break;
    // What is left after the quantized component; put back (and stop) when
    // the quantized component does not help.
    AddComponent(res, rows, columns, -1.0, sa, ka.data(), sb, kb.data());
    const double left = SumSquares(res, rows * columns);
    if (!(left < fit.energy_left.back())) {
      AddComponent(res, rows, columns, 1.0, sa, ka.data(), sb, kb.data());
      break;
    }
    fit.energy_left.push_back(left);
    fit.scale_a.push_back(sa);
    fit.scale_b.push_back(sb);
    fit.a.insert(fit.a.end(), ka.begin(), ka.end());
    fit.b.insert(fit.b.end(), kb.begin(), kb.end());
    ++fit.rank;
  }
  return fit;
}

std::vector<std::byte> TruncateLowRank(const LowRankFit& fit, uint64_t rows, uint64_t columns, uint32_t rank) {
  rank = std::min(rank, fit.rank);
  std::vector<std::byte> out(rank == 0 ? 0 : LowRankBlockSize(rows, columns, rank));
  if (rank == 0) return out;
  std::byte* p = out.data();
  for (uint32_t k = 0; k < rank; ++k) {
    StoreLE32(p + 4 * k, std::bit_cast<uint32_t>(fit.scale_a[k]));
    StoreLE32(p + 4 * (rank + k), std::bit_cast<uint32_t>(fit.scale_b[k]));
  }
  std::memcpy(p + 8 * uint64_t{rank}, fit.a.data(), rank * rows);
  std::memcpy(p + 8 * uint64_t{rank} + rank * rows, fit.b.data(), rank * columns);
  return out;
}

}  // namespace ckptfs::lossy

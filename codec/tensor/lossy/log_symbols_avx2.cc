// Step 2 of the log mode (symbols, log_codec.cc) and the masks the
// hysteresis and the zero carry start from, by AVX2 (see log_index.h):
// integer passes over the grid indices and the symbols, split from
// log_index.cc, whose passes compute the indices themselves. Each equals
// its scalar reference in log_index.h exactly
// (tests/unit/codec/lossy_log_simd_test.cc).
#include <cstring>

#include "codec/tensor/lossy/log_index.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

#if defined(__x86_64__)

__attribute__((target("avx2"))) void SymbolPassAvx2(const int32_t* index, const int32_t* base_index, int64_t origin,
                                                    int64_t shift, uint64_t n, uint32_t* symbols,
                                                    LogWidthCounts* widths) {
  // Per lane: the width as a table column, 33 (a column past the counted
  // ones) for an escaped symbol.
  uint64_t counts[4][34] = {};
  uint64_t far = 0;
  const __m256i origin_v = _mm256_set1_epi32(static_cast<int32_t>(origin));
  const __m256i shift_v = _mm256_set1_epi32(static_cast<int32_t>(shift));
  const __m256i no_index = _mm256_set1_epi32(kNoIndex);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + i));
    __m256i predicted = origin_v;
    if (base_index != nullptr) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base_index + i));
      predicted = _mm256_blendv_epi8(_mm256_add_epi32(b, shift_v), origin_v, _mm256_cmpeq_epi32(b, no_index));
    }
    // |q|, |predicted| < 2^25, so the int32 difference equals the int64 one
    // (lanes without an index wrap, and are replaced below).
    const __m256i d = _mm256_sub_epi32(q, predicted);
    const __m256i zigzag = _mm256_xor_si256(_mm256_slli_epi32(d, 1), _mm256_srai_epi32(d, 31));
    __m256i sym = _mm256_andnot_si256(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()),
                                      _mm256_add_epi32(zigzag, _mm256_set1_epi32(1)));
    const __m256i too_far = _mm256_or_si256(_mm256_cmpgt_epi32(d, _mm256_set1_epi32((1 << 30) - 1)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(-(1 << 30) + 1), d));
    sym = _mm256_or_si256(sym, _mm256_or_si256(too_far, _mm256_cmpeq_epi32(q, no_index)));
    sym = _mm256_blendv_epi8(sym, _mm256_set1_epi32(static_cast<int>(kSymbolZero)),
                             _mm256_cmpeq_epi32(q, _mm256_set1_epi32(kZeroIndex)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(symbols + i), sym);
    // The width from the float's exponent: exact below 2^24; 0 -> 0.
    const __m256i escaped = _mm256_cmpeq_epi32(sym, _mm256_set1_epi32(-1));
    const __m256i exponent = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(sym)), 23);
    __m256i width = _mm256_max_epi32(_mm256_sub_epi32(exponent, _mm256_set1_epi32(126)), _mm256_setzero_si256());
    width = _mm256_blendv_epi8(width, _mm256_set1_epi32(33), escaped);
    alignas(32) int32_t w[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), width);
    for (int l = 0; l < 8; ++l) ++counts[l & 3][w[l]];
    const __m256i far_lanes = _mm256_andnot_si256(_mm256_cmpeq_epi32(q, no_index), escaped);
    far += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(far_lanes)))));
  }
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 33; ++c) widths->counts[t][c] += counts[t][c];
  widths->far += far;
  for (; i < n; ++i) {
    const int64_t predicted = base_index != nullptr ? Predict(base_index[i], origin, shift) : origin;
    symbols[i] = Symbol(index[i], predicted);
    widths->Add(i, symbols[i], index[i]);
  }
}

__attribute__((target("avx2"))) void MovedLevelMasksAvx2(const int32_t* index, const int32_t* base_index,
                                                         int32_t shift, uint64_t n, uint8_t* masks) {
  const __m256i shift_v = _mm256_set1_epi32(shift);
  const __m256i no_index = _mm256_set1_epi32(kNoIndex), zero_index = _mm256_set1_epi32(kZeroIndex);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base_index + i));
    const __m256i skip = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpeq_epi32(q, no_index), _mm256_cmpeq_epi32(q, zero_index)),
        _mm256_or_si256(_mm256_cmpeq_epi32(b, no_index), _mm256_cmpeq_epi32(_mm256_add_epi32(b, shift_v), q)));
    masks[i / 8] = static_cast<uint8_t>(~_mm256_movemask_ps(_mm256_castsi256_ps(skip)) & 0xff);
  }
  if (i < n) {
    uint8_t m = 0;
    for (uint64_t j = i; j < n; ++j) {
      const int32_t q = index[j], b = base_index[j];
      const int32_t predicted = static_cast<int32_t>(static_cast<uint32_t>(b) + static_cast<uint32_t>(shift));
      if (q != kNoIndex && q != kZeroIndex && b != kNoIndex && predicted != q) m |= static_cast<uint8_t>(1u << (j - i));
    }
    masks[i / 8] = m;
  }
}

__attribute__((target("avx2"))) void ZeroCarryMasksF32Avx2(const uint32_t* symbols, const std::byte* base,
                                                           uint64_t n, uint8_t* masks) {
  const __m256i above_zero = _mm256_set1_epi32(static_cast<int>(kSymbolZero));
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i sym = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 4 * i));
    // Symbols are unsigned: sym <= 1 iff min(sym, 1) == sym.
    const __m256i small = _mm256_cmpeq_epi32(_mm256_min_epu32(sym, above_zero), sym);
    const __m256i hit = _mm256_and_si256(small, _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    masks[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)) & 0xff);
  }
  if (i < n) {
    uint8_t m = 0;
    for (uint64_t j = i; j < n; ++j) {
      uint32_t bits;
      std::memcpy(&bits, base + 4 * j, 4);
      if (symbols[j] <= kSymbolZero && bits == 0) m |= static_cast<uint8_t>(1u << (j - i));
    }
    masks[i / 8] = m;
  }
}

__attribute__((target("avx2"))) uint64_t ListEscapesAvx2(const uint32_t* symbols, uint64_t n, uint32_t limit,
                                                         uint32_t* positions) {
  const __m256i above = _mm256_set1_epi32(static_cast<int>(~limit));  // limit = 2^b - 1: sym > limit iff a bit here
  uint64_t count = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    if (_mm256_testz_si256(v, above)) continue;
    for (uint64_t j = i; j < i + 8; ++j)
      if (symbols[j] > limit) positions[count++] = static_cast<uint32_t>(j);
  }
  for (; i < n; ++i)
    if (symbols[i] > limit) positions[count++] = static_cast<uint32_t>(i);
  return count;
}

__attribute__((target("avx2"))) uint64_t PackSymbolsAvx2(const uint32_t* symbols, uint64_t n, uint32_t bits,
                                                         std::byte* out) {
  const uint32_t limit = (1u << bits) - 1;
  const __m256i above = _mm256_set1_epi32(static_cast<int>(~limit));
  const __m256i low32 = _mm256_set1_epi64x(0xFFFFFFFF);
  const __m128i shift1 = _mm_cvtsi32_si128(static_cast<int>(bits)), shift2 = _mm_cvtsi32_si128(static_cast<int>(2 * bits));
  const __m256i zero_symbol = _mm256_set1_epi32(static_cast<int>(kSymbolZero));
  uint64_t zeros = 0, i = 0;
  // Eight symbols fill exactly `bits` bytes, so every group starts on a byte.
  for (std::byte* o = out; i + 8 <= n; i += 8, o += bits) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    v = _mm256_and_si256(v, _mm256_cmpeq_epi32(_mm256_and_si256(v, above), _mm256_setzero_si256()));
    zeros += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero_symbol))))));
    // Pairs: s[2k] | s[2k+1] << bits in 64-bit lane k (2 bits <= 32 bits).
    const __m256i pairs = _mm256_or_si256(_mm256_and_si256(v, low32), _mm256_sll_epi64(_mm256_srli_epi64(v, 32), shift1));
    const __m128i packed_pairs =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
    // Quads: 4 bits <= 64 bits in each 64-bit half.
    const __m128i quads = _mm_or_si128(_mm_and_si128(packed_pairs, _mm256_castsi256_si128(low32)),
                                       _mm_sll_epi64(_mm_srli_epi64(packed_pairs, 32), shift2));
    // The group is quad0 | quad1 << 4 bits (8 bits <= 128 bits): two words.
    const uint64_t quad0 = static_cast<uint64_t>(_mm_cvtsi128_si64(quads));
    const uint64_t quad1 = static_cast<uint64_t>(_mm_extract_epi64(quads, 1));
    const uint32_t split = 4 * bits;  // 4..64
    const uint64_t words[2] = {split == 64 ? quad0 : quad0 | quad1 << split, split == 64 ? quad1 : quad1 >> (64 - split)};
    std::memcpy(o, words, 16);  // little-endian host; the bytes past the group are rewritten next
  }
  // The last symbols (fewer than 8), from a byte boundary as well.
  std::byte* o = out + n / 8 * bits;
  uint64_t acc = 0;
  uint32_t filled = 0;
  for (; i < n; ++i) {
    const uint32_t sym = symbols[i] > limit ? 0 : symbols[i];
    zeros += sym == kSymbolZero ? 1 : 0;
    acc |= static_cast<uint64_t>(sym) << filled;
    for (filled += bits; filled >= 8; filled -= 8, acc >>= 8) *o++ = std::byte(acc & 0xFF);
  }
  if (filled > 0) *o = std::byte(acc & 0xFF);
  return zeros;
}

#else

void SymbolPassAvx2(const int32_t*, const int32_t*, int64_t, int64_t, uint64_t, uint32_t*, LogWidthCounts*) {}
void MovedLevelMasksAvx2(const int32_t*, const int32_t*, int32_t, uint64_t, uint8_t*) {}
void ZeroCarryMasksF32Avx2(const uint32_t*, const std::byte*, uint64_t, uint8_t*) {}
uint64_t ListEscapesAvx2(const uint32_t*, uint64_t, uint32_t, uint32_t*) { return 0; }
uint64_t PackSymbolsAvx2(const uint32_t*, uint64_t, uint32_t, std::byte*) { return 0; }

#endif

}  // namespace ckptfs::lossy

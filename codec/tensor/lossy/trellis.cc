// Trellis-coded quantization: the encoder's Viterbi search and the mode-3
// decoder (LOSSY.md section 11). Compiled with -ffp-contract=off: the
// reconstruction is a decoder output and the error sums decide the bytes.
#include "codec/tensor/lossy/trellis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/rans_context.h"

namespace ckptfs::lossy {
namespace {

// The search aims at this share of the allowed error on a sample of the
// chunk; the full chunk is then measured, and a miss shrinks the step.
constexpr double kTargetShare = 0.985;
constexpr int kMaxAttempts = 3;
// The step and the rate-distortion weight are searched on every
// (n / kSampleElements)-th element.
constexpr uint64_t kSampleElements = 16384;
// The Viterbi cost of an element is error^2 + lambda * bits with lambda =
// c * step^2: the candidates for c (the best differs with the residual's
// shape and the rate; 0 would be plain trellis-coded quantization).
constexpr double kLambdaFactors[] = {0.5, 1.0};
constexpr int kStepBisections = 8;
// Elements beyond this many steps are kept exact (|k| <= 127 reaches 255).
constexpr double kMaxMultiple = 250.0;
// Smaller chunks are left to the quantized mode: the context tables of
// the symbols outweigh what the trellis saves.
constexpr uint64_t kMinTrellisElements = 4096;
// Bits charged for a symbol no element used in the previous pass.
constexpr double kUnseenBits = 16.0;

struct Predecessor {
  uint8_t state, parity;
};
// The two (state, parity of k) pairs that lead into each state.
struct PredecessorTable {
  std::array<std::array<Predecessor, 2>, kTrellisStates> into{};
  PredecessorTable() {
    std::array<int, kTrellisStates> filled{};
    for (uint32_t s = 0; s < kTrellisStates; ++s)
      for (int32_t p = 0; p < 2; ++p) {
        const uint8_t t = TrellisNext(s, p);
        into[t][filled[t]++] = {static_cast<uint8_t>(s), static_cast<uint8_t>(p)};
      }
  }
};
const PredecessorTable kPredecessors;

// Bits of each symbol in each state's context.
using Costs = std::array<std::array<double, 256>, kTrellisStates>;
using Counts = std::array<std::array<uint64_t, 256>, kTrellisStates>;

Costs InitialCosts() {
  Costs c;
  for (auto& row : c)
    for (size_t z = 0; z < 256; ++z) row[z] = z == kTrellisExactSymbol ? 24.0 : 1.0 + 1.5 * static_cast<double>(z);
  return c;
}

Costs CostsOf(const Counts& counts) {
  Costs c;
  for (uint32_t s = 0; s < kTrellisStates; ++s) {
    uint64_t total = 0;
    for (uint64_t k : counts[s]) total += k;
    for (size_t z = 0; z < 256; ++z)
      c[s][z] = counts[s][z] == 0 || total == 0
                    ? kUnseenBits
                    : -std::log2(static_cast<double>(counts[s][z]) / static_cast<double>(total));
  }
  return c;
}

// Empirical entropy of the symbols in their contexts, in bits.
double CodedBits(const Counts& counts) {
  double bits = 0.0;
  for (const auto& row : counts) {
    uint64_t total = 0;
    for (uint64_t k : row) total += k;
    for (uint64_t k : row)
      if (k != 0) bits -= static_cast<double>(k) * std::log2(static_cast<double>(k) / static_cast<double>(total));
  }
  return bits;
}

bool ForcedExact(float r, double step) {
  return !std::isfinite(r) || std::fabs(static_cast<double>(r)) >= kMaxMultiple * step;
}

// The two candidate indices of a residual in a state of quantizer q: the
// multiples 2k + q on either side of r / step (their k differ in parity).
struct Candidates {
  int32_t k[2];
  double err[2];
};
Candidates CandidatesOf(double r, double step, double inv_step, int32_t q) {
  const double t = (r * inv_step - q) * 0.5;
  // floor(t) without a library call: truncate, then step down below zero.
  // (|t| <= kMaxMultiple / 2 here: forced-exact elements never get here.)
  int32_t k0 = static_cast<int32_t>(t);
  k0 -= static_cast<double>(k0) > t;
  k0 = std::clamp(k0, -kTrellisMaxIndex, kTrellisMaxIndex - 1);
  Candidates c;
  for (int j = 0; j < 2; ++j) {
    c.k[j] = k0 + j;
    const double d = r - static_cast<double>(TrellisMultiple(static_cast<uint32_t>(q), c.k[j])) * step;
    c.err[j] = d * d;
  }
  return c;
}

// The index an element takes leaving state s with parity p (the candidate
// of that parity), or 0 for a forced-exact element.
int32_t IndexOf(const Candidates& c, int32_t p) { return (c.k[0] & 1) == p ? c.k[0] : c.k[1]; }

struct PassResult {
  double error = 0.0;  // sum of (r - level)^2 over the quantized elements
  double bits = 0.0;   // coded bits at the pass's own statistics, exact list included
  Counts counts{};
};

// One Viterbi pass over r[0..n) (element i at r[i * stride]): the index
// sequence minimizing sum error^2 + lambda * bits under `costs`. Writes
// the symbols and their states (contexts) when `symbols` is not null.
PassResult Viterbi(const float* r, uint64_t n, uint64_t stride, double step, double lambda, const Costs& costs,
                   size_t exact_bytes, std::vector<uint8_t>& back, uint8_t* symbols, uint8_t* states) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double inv_step = 1.0 / step;
  EnsureSize(&back, n * kTrellisStates);
  std::array<double, kTrellisStates> pm;
  pm.fill(kInf);
  pm[0] = 0.0;
  for (uint64_t i = 0; i < n; ++i) {
    const float ri = r[i * stride];
    // branch[s][p]: the path cost leaving state s with an index of parity
    // p; a forced-exact element takes k = 0 (even) only.
    double branch[kTrellisStates][2];
    if (ForcedExact(ri, step)) {
      for (uint32_t st = 0; st < kTrellisStates; ++st) {
        branch[st][0] = pm[st] + lambda * costs[st][kTrellisExactSymbol];
        branch[st][1] = kInf;
      }
    } else {
      const double rv = static_cast<double>(ri);
      const Candidates cand[2] = {CandidatesOf(rv, step, inv_step, 0), CandidatesOf(rv, step, inv_step, 1)};
      for (uint32_t st = 0; st < kTrellisStates; ++st) {
        const Candidates& c = cand[st & 1];
        const int lo = c.k[0] & 1;  // the parity of candidate 0
        branch[st][lo] = pm[st] + c.err[0] + lambda * costs[st][TrellisZigzag(c.k[0])];
        branch[st][lo ^ 1] = pm[st] + c.err[1] + lambda * costs[st][TrellisZigzag(c.k[1])];
      }
    }
    std::array<double, kTrellisStates> next;
    uint8_t* bk = back.data() + i * kTrellisStates;
    for (uint32_t t = 0; t < kTrellisStates; ++t) {
      const Predecessor a = kPredecessors.into[t][0], b = kPredecessors.into[t][1];
      const double ca = branch[a.state][a.parity], cb = branch[b.state][b.parity];
      const bool second = cb < ca;
      next[t] = second ? cb : ca;
      bk[t] = second;
    }
    pm = next;
    if ((i & 4095) == 4095) {  // keep the path costs small next to an element's
      const double low = *std::min_element(pm.begin(), pm.end());
      for (double& v : pm) v -= low;
    }
  }
  PassResult out;
  uint32_t s = static_cast<uint32_t>(std::min_element(pm.begin(), pm.end()) - pm.begin());
  uint64_t exact = 0;
  for (uint64_t i = n; i-- > 0;) {
    const Predecessor pr = kPredecessors.into[s][back[i * kTrellisStates + s]];
    const float ri = r[i * stride];
    uint8_t sym = kTrellisExactSymbol;
    if (!ForcedExact(ri, step)) {
      const double rv = static_cast<double>(ri);
      const Candidates c = CandidatesOf(rv, step, inv_step, pr.state & 1);
      const int32_t k = IndexOf(c, pr.parity);
      sym = TrellisZigzag(k);
      const double d = rv - static_cast<double>(TrellisMultiple(pr.state, k)) * step;
      out.error += d * d;
    } else {
      ++exact;
    }
    ++out.counts[pr.state][sym];
    if (symbols != nullptr) symbols[i] = sym, states[i] = pr.state;
    s = pr.state;
  }
  out.bits = CodedBits(out.counts) + static_cast<double>(exact) * 8.0 * static_cast<double>(exact_bytes);
  return out;
}

struct Choice {
  double step = 0.0, lambda = 0.0, bits = 0.0;
  Costs costs{};
};

// The largest step whose sample error stays within `target` at lambda =
// factor * step^2, and its bits; nullopt if none of the range fits.
std::optional<Choice> SearchStep(const float* r, uint64_t n, uint64_t stride, double target, double factor,
                                 size_t exact_bytes, std::vector<uint8_t>& back) {
  const double rms = std::sqrt(target / static_cast<double>(n));
  if (!(rms > 0) || !std::isfinite(rms)) return std::nullopt;
  double lo = rms / 4.0, hi = rms * 16.0;  // in steps: lo should fit, hi need not
  Costs costs = InitialCosts();
  std::optional<Choice> good;
  // Each probe runs twice, the second time at the first's statistics, so
  // that its error and bits are those of a self-consistent code.
  auto probe = [&](double step) {
    const double lambda = factor * step * step;
    const PassResult p1 = Viterbi(r, n, stride, step, lambda, costs, exact_bytes, back, nullptr, nullptr);
    const Costs used = CostsOf(p1.counts);
    const PassResult p2 = Viterbi(r, n, stride, step, lambda, used, exact_bytes, back, nullptr, nullptr);
    costs = CostsOf(p2.counts);
    if (p2.error > target) return false;
    good = Choice{step, lambda, p2.bits, used};
    return true;
  };
  if (!probe(lo)) return std::nullopt;
  for (int it = 0; it < kStepBisections; ++it) {
    const double mid = std::sqrt(lo * hi);
    if (probe(mid)) lo = mid;
    else hi = mid;
  }
  return good;
}

// The reconstruction of index k in state s (LOSSY.md section 11).
template <typename E>
typename E::Bits Reconstruct(uint32_t state, int32_t k, float step, bool has_base, typename E::Bits base) {
  const int32_t j = TrellisMultiple(state, k);
  if (j == 0) return has_base ? base : typename E::Bits{0};
  const float bf = has_base ? E::ToFloat(base) : 0.0f;
  return E::FromFloat(bf + static_cast<float>(j) * step);
}

struct Measured {
  double error_sq = 0.0;  // in the codec's reduction order (LOSSY.md section 2)
  double max_abs = 0.0;
};

// Writes the reconstruction of `symbols` into `recon` and measures its
// error over the finite values.
template <typename E>
Measured ReconstructAndMeasure(ByteSpan values, ByteSpan base, float step, const uint8_t* symbols,
                               const uint8_t* states, MutableByteSpan recon, uint64_t n) {
  Measured m;
  const bool has_base = !base.empty();
  for (uint64_t start = 0; start < n; start += kReduceBlock) {
    const uint64_t end = std::min<uint64_t>(n, start + kReduceBlock);
    double lanes[kReduceLanes] = {};
    for (uint64_t i = start; i < end; ++i) {
      const typename E::Bits x = LoadBits<E>(values.data(), i);
      typename E::Bits out = x;
      if (symbols[i] != kTrellisExactSymbol)
        out = Reconstruct<E>(states[i], TrellisUnzigzag(symbols[i]), step, has_base,
                             has_base ? LoadBits<E>(base.data(), i) : typename E::Bits{0});
      StoreBits<E>(recon.data(), i, out);
      double abs_error = 0.0;
      lanes[i % kReduceLanes] += SquaredError<E>(x, out, &abs_error);
      m.max_abs = std::max(m.max_abs, abs_error);
    }
    m.error_sq += FoldLanes(lanes);
  }
  return m;
}

Measured ReconstructAndMeasureAs(ElementType type, ByteSpan values, ByteSpan base, float step, const uint8_t* symbols,
                               const uint8_t* states, MutableByteSpan recon, uint64_t n) {
  switch (type) {
    case ElementType::kF32: return ReconstructAndMeasure<F32Elem>(values, base, step, symbols, states, recon, n);
    case ElementType::kF16: return ReconstructAndMeasure<F16Elem>(values, base, step, symbols, states, recon, n);
    default: return ReconstructAndMeasure<BF16Elem>(values, base, step, symbols, states, recon, n);
  }
}

}  // namespace

Result<std::optional<EncodedChunk>> EncodeTrellisChunk(ElementType type, ByteSpan values, ByteSpan base,
                                                       std::span<const float> residual, double norm_sq,
                                                       double allowed_sq, size_t size_to_beat,
                                                       Scratch::Buffers& s, int zstd_level, MutableByteSpan recon) {
  const size_t width = ElementSize(type);
  const uint64_t n = residual.size();
  if (n < kMinTrellisElements || !(allowed_sq > 0) || !std::isfinite(allowed_sq)) return std::optional<EncodedChunk>();
  const size_t exact_bytes = width + 2;  // raw bits plus about a varint gap

  // 1. Step and lambda on a sample.
  const uint64_t stride = std::max<uint64_t>(1, n / kSampleElements);
  const uint64_t sampled = (n + stride - 1) / stride;
  const double sample_target = allowed_sq * kTargetShare * static_cast<double>(sampled) / static_cast<double>(n);
  std::optional<Choice> best;
  for (double factor : kLambdaFactors) {
    std::optional<Choice> c = SearchStep(residual.data(), sampled, stride, sample_target, factor, exact_bytes,
                                         s.trellis_back);
    if (c && (!best || c->bits < best->bits)) best = c;
  }
  if (!best) return std::optional<EncodedChunk>();

  // 2. The whole chunk: two passes (the second with the first's
  // statistics), measured on the reconstruction; a miss shrinks the step.
  EnsureSize(&s.trellis_symbols, n);
  EnsureSize(&s.trellis_states, n);
  uint8_t* symbols = s.trellis_symbols.data();
  uint8_t* states = s.trellis_states.data();
  double step = best->step;
  const double factor = best->lambda / (best->step * best->step);
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const float step_f = static_cast<float>(step);
    if (!(step_f > 0.0f) || !std::isfinite(step_f)) break;
    const double lambda = factor * step * step;
    const PassResult first = Viterbi(residual.data(), n, 1, step_f, lambda, best->costs, exact_bytes,
                                     s.trellis_back, nullptr, nullptr);
    const PassResult second = Viterbi(residual.data(), n, 1, step_f, lambda, CostsOf(first.counts), exact_bytes,
                                      s.trellis_back, symbols, states);
    const Measured measured = ReconstructAndMeasureAs(type, values, base, step_f, symbols, states, recon, n);
    const double error_sq = measured.error_sq;
    if (!(error_sq <= allowed_sq)) {
      const double ratio = error_sq > 0 && std::isfinite(error_sq) ? allowed_sq / error_sq : 0.25;
      step *= std::sqrt(std::min(ratio, 1.0)) * 0.98;
      continue;
    }
    if (second.bits / 8.0 >= static_cast<double>(size_to_beat)) return std::optional<EncodedChunk>();

    // 3. The stream.
    uint64_t exact = 0;
    for (uint64_t i = 0; i < n; ++i) exact += symbols[i] == kTrellisExactSymbol;
    EnsureSize(&s.exact_positions, exact);
    EnsureSize(&s.exact_raw, exact * width);
    for (uint64_t i = 0, e = 0; i < n; ++i)
      if (symbols[i] == kTrellisExactSymbol) {
        s.exact_positions[e] = static_cast<uint32_t>(i);
        std::memcpy(s.exact_raw.data() + e * width, values.data() + i * width, width);
        ++e;
      }
    BuildExactList(std::span<const uint32_t>(s.exact_positions.data(), exact),
                   ByteSpan(s.exact_raw.data(), exact * width), &s.exact_list);
    ByteSpan exact_z;
    if (exact > 0) {
      ASSIGN_OR_RETURN(exact_z, CompressZstd(s.cctx.get(), zstd_level, s.exact_list, &s.zstd_exact));
    }
    const size_t capacity = n + 4096;
    EnsureSize(&s.rans_contexts, capacity);
    ASSIGN_OR_RETURN(size_t main_size, RansEncodeInContexts(symbols, n, ByteContexts{states, kTrellisStates},
                                                            s.rans_contexts.data(), capacity));
    StreamHeader h;
    h.version = kStreamVersionTrellis;
    h.mode = StreamMode::kTrellis;
    h.type = type;
    h.bits = 8;
    h.flags = (base.empty() ? 0 : kFlagDelta) | kFlagCompactHeader;
    h.num_levels = kTrellisStates;
    h.element_count = n;
    h.exact_count = exact;
    h.exact_raw_size = exact == 0 ? 0 : s.exact_list.size();
    h.main_size = main_size;
    h.exact_size = exact_z.size();
    EncodedChunk chunk;
    chunk.bytes.reserve(StreamHeader::kEncodedSize + 4 + main_size + exact_z.size() + kTrailerSize);
    h.EncodeTo(&chunk.bytes);
    ByteWriter w(&chunk.bytes);
    w.U32(FloatBits(step_f));
    w.Bytes(ByteSpan(s.rans_contexts.data(), main_size));
    w.Bytes(exact_z);
    AppendChecksum(&chunk.bytes);
    if (chunk.bytes.size() >= size_to_beat) return std::optional<EncodedChunk>();
    uint64_t zero = 0;
    for (uint64_t i = 0; i < n; ++i)
      zero += symbols[i] != kTrellisExactSymbol && TrellisMultiple(states[i], TrellisUnzigzag(symbols[i])) == 0;
    chunk.stats.bits = 8;
    chunk.stats.mode = static_cast<uint8_t>(StreamMode::kTrellis);
    chunk.stats.pruned = zero;
    chunk.stats.quantized = n - zero - exact;
    chunk.stats.exact = exact;
    chunk.stats.rel_l2 = norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : 0.0;
    chunk.stats.max_abs = measured.max_abs;
    chunk.stats.err2_sum = error_sq;
    chunk.stats.ref2_sum = norm_sq;
    return std::optional<EncodedChunk>(std::move(chunk));
  }
  return std::optional<EncodedChunk>();
}

namespace {

template <typename E>
Status DecodeTyped(const StreamHeader& h, float step, ContextRansReader& reader, ExactPatcher& exact, ByteSpan base,
                   MutableByteSpan out, Checksum64Stream* hash) {
  const uint64_t n = h.element_count;
  const bool has_base = !base.empty();
  uint32_t state = 0;
  uint64_t exact_seen = 0;
  auto slice = [&](uint64_t first, uint64_t count) {
    for (uint64_t i = first; i < first + count; ++i) {
      const uint8_t sym = reader.Next(state);
      const typename E::Bits b = has_base ? LoadBits<E>(base.data(), i) : typename E::Bits{0};
      int32_t k = 0;
      if (sym == kTrellisExactSymbol) {
        ++exact_seen;
        StoreBits<E>(out.data(), i, b);  // the exact list overwrites it
      } else {
        k = TrellisUnzigzag(sym);
        StoreBits<E>(out.data(), i, Reconstruct<E>(state, k, step, has_base, b));
      }
      state = TrellisNext(state, k);
    }
    return Status::Ok();
  };
  RETURN_IF_ERROR(DecodeInSlices(n, sizeof(typename E::Bits), exact, hash, out, slice));
  RETURN_IF_ERROR(reader.Finish());
  if (exact_seen != h.exact_count)
    return Status::Corruption("lossy chunk: trellis exact symbols, want=" + std::to_string(h.exact_count) +
                              " have=" + std::to_string(exact_seen));
  return Status::Ok();
}

}  // namespace

Status DecodeTrellisBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                         Scratch::Buffers& s, Checksum64Stream* hash) {
  ByteReader r(body, "lossy chunk");
  const float step = BitsFloat(r.U32());
  ByteSpan main = r.Bytes(h.main_size);
  ByteSpan exact_z = r.Bytes(h.exact_size);
  RETURN_IF_ERROR(r.status());
  if (r.remaining() != 0)
    return Status::Corruption("lossy chunk: trailing bytes, want=0 have=" + std::to_string(r.remaining()));
  if (!(step > 0.0f) || !std::isfinite(step))
    return Status::Corruption("lossy chunk: trellis step is not finite and positive");
  const size_t width = ElementSize(type);
  ASSIGN_OR_RETURN(ExactPatcher exact, ExactPatcher::Open(s.dctx.get(), exact_z, h, width, &s.exact_list));
  if (h.element_count == 0) return exact.Finish(0);
  ContextRansReader reader;
  RETURN_IF_ERROR(reader.Open(main, kTrellisStates, "trellis symbols", &s.rans_context_tables));
  switch (type) {
    case ElementType::kF32: return DecodeTyped<F32Elem>(h, step, reader, exact, base, out, hash);
    case ElementType::kF16: return DecodeTyped<F16Elem>(h, step, reader, exact, base, out, hash);
    default: return DecodeTyped<BF16Elem>(h, step, reader, exact, base, out, hash);
  }
}

}  // namespace ckptfs::lossy

// The step predictor: a delta frame of weights predicted from the
// optimizer's own step direction.
//
// Between two checkpoints an Adam-type optimizer moves a weight by about
// -lr * sum over the steps of m_s / (sqrt(v_s) + eps). The checkpoint holds
// this version's m and v and the previous version's, so the update of the
// weights is predicted by (a trapezoid rule over the interval)
//
//   p = scale * w_base + step * u + base_step * u_base    (scale = 1),
//   u = m / (sqrt(v) + eps)   (u = m when there is no v, e.g. SGD momentum)
//
// with the two coefficients fitted per chunk by least squares (they absorb
// the learning rate, its schedule and the bias corrections). A third term
// in w_base (decoupled weight decay) was tried and dropped: the fit takes
// it up to explain the base's own quantization error, which is no trend,
// and it turns every unchanged element into a residual (+4 % stored on an
// Adam run without weight decay, nothing gained with AdamW). All inputs
// are *reconstructions* a decoder has before it decodes the weights: the
// base version's weights and optimizer state, and this version's optimizer
// state (never predicted itself). The weights are then coded as a delta
// frame against p instead of w_base: the codec, its error budget and its
// stream are unchanged; the residual it quantizes is what the optimizer's
// state does not explain (in the training runs of docs/eval.md 5-50 % of
// the update's energy), and under the budget schedule (an error of half
// the update) often nothing at all.
//
// p is computed in binary64 with a fixed order of operations, then rounded
// to the weights' element type: encoder and decoder get the same bits on
// every machine (compiled without FMA contraction). All of it is binary32
// when the predictor says so (f32_steps, what the encoder writes): the
// binary64 square roots, divisions and sums were a fifth of a delta
// chain's decode, two to three times the binary32 ones, for a precision
// far below the weights' quantization error.
#pragma once

#include <cstdint>
#include <optional>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

struct StepPredictor {
  double scale = 1.0;      // coefficient of w_base
  double step = 0.0;       // coefficient of u (this version's step direction)
  double base_step = 0.0;  // coefficient of u_base (the base version's)
  double eps = 1e-8;       // the denominator's epsilon
  // u, u_base and p in binary32, the coefficients rounded to binary32
  // (FORMAT.md "Step prediction", inputs bit 5).
  bool f32_steps = false;
};

// The reconstructions a prediction reads, all of the same element count n.
// Without m there is no step term: p = scale * w_base (the first moment
// itself, which decays by beta1 per step between versions).
struct StepSources {
  ElementType weight_type = ElementType::kF32;
  ByteSpan weight_base;  // the base version's weights (n elements)
  ElementType state_type = ElementType::kF32;
  ByteSpan m;       // this version's first moment (n elements), or empty
  ByteSpan v;       // its second moment, or empty (then u = m)
  ByteSpan m_base;  // the base version's first moment, or empty (no base_step term)
  ByteSpan v_base;  // its second moment: empty exactly when v is
};

// Checks sizes: every span holds n elements of its type; v, m_base and
// v_base are empty without m; v_base is present exactly when v and m_base
// are. InvalidArgument otherwise.
Status CheckStepSources(const StepSources& sources);

// Writes p (n elements of weight_type) into `out`. An element whose inputs
// are not finite (or whose v is negative) has u = 0. REQUIRES: CheckStepSources(sources).ok(),
// out.size() == sources.weight_base.size(). (An element whose p is not
// finite in the weights' type keeps w_base's bits.)
void PredictWeights(const StepPredictor& predictor, const StepSources& sources, MutableByteSpan out);
// The same without the vector kernels (same bits; tests compare the two).
void PredictWeightsPortable(const StepPredictor& predictor, const StepSources& sources, MutableByteSpan out);

// PredictWeights of f32 weights as a decoder's base slices (base_slices.h):
// the prediction of elements [first, +count) only, where the decoder reads
// it, instead of the whole chunk's written out first (the same bits: each
// element's prediction reads only that element's inputs).
// Thread safety: Fill may be called concurrently.
class PredictionSlices final : public BaseSlices {
 public:
  // REQUIRES: CheckStepSources(sources).ok(), sources.weight_type f32. The
  // sources' bytes and the predictor must outlive the object.
  PredictionSlices(const StepPredictor& predictor, const StepSources& sources)
      : predictor_(predictor), sources_(sources) {}
  uint64_t elements() const override { return sources_.weight_base.size() / 4; }
  void Fill(uint64_t first, uint64_t count, std::byte* out) const override;

 private:
  const StepPredictor& predictor_;
  StepSources sources_;
};

// The least-squares scale a of `values` ~ a * base (n elements of `type`,
// finite elements only); nullopt when base has no energy.
std::optional<double> FitScale(ElementType type, ByteSpan values, ByteSpan base);
// The same without the vector kernels (the same bits; tests compare the two).
std::optional<double> FitScalePortable(ElementType type, ByteSpan values, ByteSpan base);

// Least-squares coefficients for `weights` (this version's original values,
// n elements of weight_type) over the finite elements, with eps = `eps`
// (nullopt when the system is degenerate: no usable regressor), and
// PredictWeights of them into `out`, without the base's moments when the
// fit left their term out (base_step == 0), as a decoder then computes it.
// Each element's steps are computed once: `steps` holds 2n doubles of
// working memory. The result has f32_steps as given (its steps computed so).
// REQUIRES: CheckStepSources(sources).ok(), out.size() ==
// sources.weight_base.size().
std::optional<StepPredictor> FitAndPredict(ByteSpan weights, const StepSources& sources, double eps, bool f32_steps,
                                           double* steps, MutableByteSpan out);
// The same without the vector kernels (same coefficients and bits; tests
// compare the two).
std::optional<StepPredictor> FitAndPredictPortable(ByteSpan weights, const StepSources& sources, double eps,
                                                   bool f32_steps, double* steps, MutableByteSpan out);

// The correlation of the update (weights - weight_base) with u over at most
// `samples` evenly spaced elements: cheap evidence that m and v belong to
// these weights (a checkpoint names optimizer state by index, not by the
// parameter's name). In [-1, 1]; 0 when nothing moved.
double StepCorrelation(ByteSpan weights, const StepSources& sources, double eps, uint64_t samples);

}  // namespace ckptfs::lossy

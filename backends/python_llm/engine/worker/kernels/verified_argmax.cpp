// Greedy decoding's argmax from bf16 logits, made exact by a bound (CPU).
//
// Where the CPU has bf16 dot products (AVX512-BF16, AMX-BF16), the LM head
// in bf16 takes half the time of fp32 or less (oneDNN, SmolLM2's 49k x 576
// on a 2-core Zen 4: 9.3 vs 17.6 ms at 57 rows, 2.3 vs 4.5 ms at one row).
// Its logits are approximate, but each one's error has a rigorous bound:
// with inputs and output rounded to bf16 (relative error u = 2^-8 each) and
// fp32 accumulation over `dim` terms,
//
//   |approx_v - exact_v| <= bound * sum_i |h_i| |w_vi| <= bound * ||h|| ||w_v||
//
// (Cauchy-Schwarz; `bound` is ~3u, computed by the caller from `dim`). So
// the exact argmax is among the candidates whose upper end approx_v + e_v
// reaches the largest lower end max(approx_u - e_u). Those few (SmolLM2 on
// the bench's workload: one for the median row, 12 at the 90th percentile)
// are dotted again in fp64 from the fp32 hidden row and weights, and the
// largest wins (the first on ties). One candidate is the answer as it is.
// The result is the argmax of the exact logits: an fp32 GEMM's argmax can
// differ from it only at ties within fp32 rounding, as two GEMMs' can.
//
// A row whose hidden state or approximate logits are not all finite gets -1:
// the caller decides it the fp32 way (torch.argmax's NaN rule).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <omp.h>

#include "verified_candidates.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// the largest lower end, max_v(approx_v - margin * norms_v); NaN when an
// approximate logit is not finite
float largest_lower_end(const uint16_t* approx, const float* norms, float margin, int64_t vocab) {
  int64_t v = 0;
  float best = -std::numeric_limits<float>::infinity();
  bool finite = true;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  const __m512 m = _mm512_set1_ps(margin);
  __m512 best_lanes = _mm512_set1_ps(best);
  __mmask16 not_finite = 0;
  for (; v + 16 <= vocab; v += 16) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(approx + v));
    const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    // 0x99: NaN, +inf, -inf
    not_finite |= _mm512_fpclass_ps_mask(a, 0x99);
    best_lanes = _mm512_max_ps(best_lanes, _mm512_fnmadd_ps(m, _mm512_loadu_ps(norms + v), a));
  }
  finite = not_finite == 0;
  best = _mm512_reduce_max_ps(best_lanes);
#endif
  for (; v < vocab; ++v) {
    const float a = bf16_to_float(approx[v]);
    finite = finite && std::isfinite(a);
    best = std::fmax(best, a - margin * norms[v]);
  }
  return finite ? best : std::numeric_limits<float>::quiet_NaN();
}

int64_t decide_row(const uint16_t* approx, const float* hidden, const float* weight, int64_t weight_stride,
                   const float* norms, int64_t vocab, int64_t dim, float bound, int64_t* num_candidates) {
  double squares = 0.0;
  for (int64_t i = 0; i < dim; ++i) squares += static_cast<double>(hidden[i]) * hidden[i];
  const double hidden_norm = std::sqrt(squares);
  // the margin's own rounding (float product, norms stored in fp32) is
  // far inside the slack `bound` carries
  const float margin = static_cast<float>(bound * hidden_norm);
  if (!std::isfinite(hidden_norm) || !std::isfinite(margin)) return -1;
  const float floor = largest_lower_end(approx, norms, margin, vocab);
  if (std::isnan(floor)) return -1;

  verified::ExactArgmax best(hidden, weight, weight_stride, dim);
  int64_t v = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  const __m512 m = _mm512_set1_ps(margin);
  const __m512 f = _mm512_set1_ps(floor);
  for (; v + 16 <= vocab; v += 16) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(approx + v));
    const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    __mmask16 reaches = _mm512_cmp_ps_mask(_mm512_fmadd_ps(m, _mm512_loadu_ps(norms + v), a), f, _CMP_GE_OQ);
    while (reaches) {
      best.consider(v + __builtin_ctz(reaches));
      reaches &= reaches - 1;
    }
  }
#endif
  for (; v < vocab; ++v)
    if (bf16_to_float(approx[v]) + margin * norms[v] >= floor) best.consider(v);
  *num_candidates = best.candidates();
  return best.token();
}

}  // namespace

extern "C" {

// 1 when this build has bf16 dot-product instructions, where a bf16 LM head
// is worth running
int bf16_dot_supported() {
#if defined(__AVX512BF16__) || defined(__AMX_BF16__)
  return 1;
#else
  return 0;
#endif
}

// out[r] = the exact argmax of hidden[r] . weight[v] over v, from approx
// [rows, vocab] bf16 logits (row stride `approx_stride`) whose errors are
// within bound * ||hidden[r]|| * norms[v]; -1 where a row is not finite.
// candidates[r]: how many logits had to be dotted again (1: none).
void verified_argmax_bf16(const uint16_t* approx, int64_t rows, int64_t vocab, int64_t approx_stride,
                          const float* hidden, int64_t hidden_stride, const float* weight, int64_t weight_stride,
                          const float* norms, int64_t dim, float bound, int64_t* out, int64_t* candidates,
                          int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    candidates[r] = 0;
    out[r] = decide_row(approx + r * approx_stride, hidden + r * hidden_stride, weight, weight_stride, norms, vocab,
                        dim, bound, candidates + r);
  }
}

}

// The exact argmax among a row's candidate logits, dotted again in fp64 from
// the fp32 hidden row and weight rows: the last step of the LM heads whose
// approximate logits (bf16: verified_argmax.cpp, int16: int16_lm_head.cpp)
// only choose the candidates by an error bound.
#pragma once

#include <cstdint>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace verified {

inline double dot_fp64(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + i)), _mm512_cvtps_pd(_mm256_loadu_ps(b + i)), acc0);
    acc1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + i + 8)),
                           _mm512_cvtps_pd(_mm256_loadu_ps(b + i + 8)), acc1);
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i)), _mm256_cvtps_pd(_mm_loadu_ps(b + i)), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + i + 4)), acc1);
  }
  const __m256d both = _mm256_add_pd(acc0, acc1);
  const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(both), _mm256_extractf128_pd(both, 1));
  sum = _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
#endif
  for (; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

// Fed the candidates in increasing vocabulary order; the largest fp64 logit
// wins, the first on ties. One candidate is the answer as it is (not dotted).
class ExactArgmax {
 public:
  ExactArgmax(const float* hidden, const float* weight, int64_t weight_stride, int64_t dim)
      : hidden_(hidden), weight_(weight), weight_stride_(weight_stride), dim_(dim) {}

  void consider(int64_t v) {
    ++count_;
    if (first_ < 0) { first_ = v; return; }
    if (best_index_ < 0) {   // the second candidate: the first one is dotted now
      best_index_ = first_;
      best_value_ = dot_fp64(hidden_, weight_ + first_ * weight_stride_, dim_);
    }
    const double value = dot_fp64(hidden_, weight_ + v * weight_stride_, dim_);
    if (value > best_value_) { best_value_ = value; best_index_ = v; }
  }

  int64_t token() const { return best_index_ >= 0 ? best_index_ : first_; }
  int64_t candidates() const { return count_; }

 private:
  const float* hidden_;
  const float* weight_;
  int64_t weight_stride_, dim_;
  int64_t count_ = 0, first_ = -1, best_index_ = -1;
  double best_value_ = -std::numeric_limits<double>::infinity();
};

}  // namespace verified

// Greedy sampling's argmax over fp32 logit rows, in one pass (CPU).
//
// torch's CPU argmax is a scalar loop (~4 ms over 64 x 49k logits on two
// cores); this is vectorized (running maximum and its index per lane) and
// parallel over rows, so its cost is one read of the logits. Semantics are
// torch's: the first maximum on ties, and a NaN counts as the maximum (the
// first NaN wins).
#include <cmath>
#include <cstdint>

#include <omp.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

int64_t first_nan(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(row[i])) return i;
  return -1;
}

int64_t argmax_scalar(const float* row, int64_t begin, int64_t n, float& best) {
  int64_t index = begin;
  best = row[begin];
  for (int64_t i = begin + 1; i < n; ++i)
    if (row[i] > best) { best = row[i]; index = i; }
  return index;
}

int64_t argmax_row(const float* row, int64_t n) {
  float best;
#if defined(__AVX2__)
  if (n >= 8) {
    // lane l sees columns l, l+8, ...; strict '>' keeps each lane's first maximum
    __m256 best_values = _mm256_loadu_ps(row);
    __m256i best_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i index = best_index;
    const __m256i step = _mm256_set1_epi32(8);
    __m256 unordered = _mm256_cmp_ps(best_values, best_values, _CMP_UNORD_Q);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
      index = _mm256_add_epi32(index, step);
      const __m256 x = _mm256_loadu_ps(row + i);
      const __m256 greater = _mm256_cmp_ps(x, best_values, _CMP_GT_OQ);
      best_values = _mm256_blendv_ps(best_values, x, greater);
      best_index = _mm256_blendv_epi8(best_index, index, _mm256_castps_si256(greater));
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(unordered)) return first_nan(row, n);
    alignas(32) float values[8];
    alignas(32) int32_t indices[8];
    _mm256_store_ps(values, best_values);
    _mm256_store_si256(reinterpret_cast<__m256i*>(indices), best_index);
    int64_t result = indices[0];
    best = values[0];
    for (int l = 1; l < 8; ++l)
      if (values[l] > best || (values[l] == best && indices[l] < result)) { best = values[l]; result = indices[l]; }
    for (; i < n; ++i) {
      if (std::isnan(row[i])) return i;
      if (row[i] > best) { best = row[i]; result = i; }
    }
    return result;
  }
#endif
  const int64_t nan_at = first_nan(row, n);
  return nan_at >= 0 ? nan_at : argmax_scalar(row, 0, n, best);
}

}  // namespace

extern "C" {

// out[r] = argmax of logits[r, 0:vocab] (row stride `row_stride` floats).
// vocab >= 1 and < 2^31 (indices are tracked in 32-bit lanes).
void argmax_rows_f32(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride, int64_t* out,
                     int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(logits + r * row_stride, vocab);
}

}

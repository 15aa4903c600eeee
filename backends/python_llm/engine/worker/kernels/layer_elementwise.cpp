// The decoder layer's elementwise steps on the CPU, fp32, one pass each:
// RMSNorm, rotary embedding of q and k together with the K/V cache write,
// and SiLU(gate) x up.
//
// In PyTorch each is a chain of small ops (RMSNorm: cast, pow, mean, add,
// rsqrt, two muls; rotary: index, cat, neg, two muls, add, then two
// index_copy_ into the cache; the MLP: chunk, silu, mul), every one a
// dispatch and a pass over memory. On the 2-core machines those chains took
// ~13% of an offline run (2.7 s of 20 s), as much as the decode attention.
// Fused, each reads its input once and writes its output once.
//
// The arithmetic follows the PyTorch reference (the model's torch path):
// fp32 statistics for RMSNorm, HF's rotate_half convention for rotary. Only
// the order of a row's sum of squares and the exp's last ulp differ.
#include <cmath>
#include <cstdint>

#include <omp.h>

#include "fast_exp.h"

namespace {

// below this many elements a call runs on one thread: waking the pool costs
// more than the work. 1 << 16 kept a 64-sequence decode step's norms (64 x
// 576) and rotary writes (64 x 960) on one thread; on the AMX machine two
// took them from 1.9 to 1.4-1.5 ms and 2.4-2.5 to 1.4-1.5 ms a step (30
// layers; the rotary's scattered cache writes miss on both cores at once)
constexpr int64_t PARALLEL_ELEMENTS = 1 << 14;

inline int threads_for(int64_t elements, int num_threads) {
  return elements >= PARALLEL_ELEMENTS ? num_threads : 1;
}

// e^-|g| never overflows: g / (1 + e^-g) for g >= 0, g e^g / (1 + e^g) below
inline float silu(float g) {
  const float e = exp_nonpositive(-std::fabs(g));
  return (g >= 0.f ? g : g * e) / (1.f + e);
}

#if defined(__AVX2__) && defined(__FMA__)
// the same on eight lanes (GCC leaves the scalar loop unvectorized)
inline __m256 silu8(__m256 g) {
  const __m256 e = exp8_nonpositive(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));
  const __m256 nonnegative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_div_ps(_mm256_blendv_ps(_mm256_mul_ps(g, e), g, nonnegative),
                       _mm256_add_ps(_mm256_set1_ps(1.f), e));
}
#endif

// x[0:half] and x[half:2 half] rotated by the angles whose cos / sin rows are c, s
// (rotate_half: out = x * cos + cat(-x2, x1) * sin)
inline void rotate(float* x, const float* c, const float* s, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i + half] + a * s[i + half];
  }
}

}  // namespace

extern "C" {

// out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for `rows` rows of `dim`.
void rms_norm_f32(const float* x, int64_t x_stride, const float* weight, float eps, float* out,
                  int64_t out_stride, int64_t rows, int64_t dim, int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows * dim, num_threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * x_stride;
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < dim; ++i) squares += row[i] * row[i];
    const float inverse = 1.f / std::sqrt(squares / static_cast<float>(dim) + eps);
    float* target = out + r * out_stride;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) target[i] = weight[i] * (row[i] * inverse);
  }
}

// In each row of qkv ([heads | kv_heads | kv_heads] x head_dim), rotate the q
// and k heads in place by the token's position (cos / sin tables of
// [table_positions, head_dim]), then store its k and v heads at the token's
// slot of the caches ([kv_heads, num_slots, head_dim]: blocks x block_size
// slots). 0 on success; 1: a position outside the tables, 2: a slot outside
// the caches (nothing is written then).
int rotary_cache_write_f32(float* qkv, int64_t qkv_stride, const int64_t* positions, const float* cos,
                           const float* sin, int64_t table_positions, const int64_t* slots, float* key_cache,
                           float* value_cache, int64_t num_slots, int64_t tokens, int64_t heads, int64_t kv_heads,
                           int64_t head_dim, int num_threads) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (positions[t] < 0 || positions[t] >= table_positions) return 1;
    if (slots[t] < 0 || slots[t] >= num_slots) return 2;
  }
  const int64_t half = head_dim / 2;
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
#pragma omp parallel for num_threads(threads_for(tokens * width, num_threads)) schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = qkv + t * qkv_stride;
    const float* c = cos + positions[t] * head_dim;
    const float* s = sin + positions[t] * head_dim;
    for (int64_t h = 0; h < heads + kv_heads; ++h) rotate(row + h * head_dim, c, s, half);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* k = row + (heads + h) * head_dim;
      const float* v = row + (heads + kv_heads + h) * head_dim;
      float* k_slot = key_cache + (h * num_slots + slots[t]) * head_dim;
      float* v_slot = value_cache + (h * num_slots + slots[t]) * head_dim;
#pragma omp simd
      for (int64_t i = 0; i < head_dim; ++i) {
        k_slot[i] = k[i];
        v_slot[i] = v[i];
      }
    }
  }
  return 0;
}

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]: the MLP's gate and
// up halves of one fused projection.
void silu_mul_f32(const float* gate_up, int64_t gate_up_stride, float* out, int64_t out_stride, int64_t rows,
                  int64_t inter, int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows * inter, num_threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * gate_up_stride;
    const float* up = gate + inter;
    float* target = out + r * out_stride;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= inter; i += 8)
      _mm256_storeu_ps(target + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
#endif
    for (; i < inter; ++i) target[i] = silu(gate[i]) * up[i];
  }
}

}

// The prefill attention's inner products on FMA lanes, over one tile of
// keys (paged_prefill_attention.cpp): scores of keys against the transposed
// queries, and probabilities times V into the running outputs. ymm from
// AVX2, zmm where the build targets AVX-512 (ROW_LANES: query rows per
// vector). Included inside that file's anonymous namespace, after KT.
#pragma once

// A loaded vector pinned to a register for the FMAs that share it. Without
// this GCC folds the load into each of them (a memory operand per FMA: the
// same query or value row read 2-4 times), and a core that loads one zmm (or
// two ymm) a cycle then waits on loads at half its FMA rate. On a Zen 4, one
// thread, a 96-row tile in L1: scores 62 -> 113 GFLOP/s and values 60 -> 107
// on zmm, 57 -> 91 and 58 -> 95 on ymm (~115 peak); whole chunks 1.22-1.40x
// (docs/benchmarks.md, "the prefill attention's loads folded into its
// FMAs"). Same instructions otherwise, so the same results bit for bit.
template <typename V>
inline V in_register(V v) {
  asm("" : "+v"(v));
  return v;
}

// Scores of two keys against NV vectors of 8 query rows:
// s[j][rows] = sum_d k[j][d] * qt[d][rows], qt the transposed, prescaled queries ([HD][rows_padded]).
template <int HD, int NV>
inline void scores_pair(const float* qt, int64_t stride, const float* k0, const float* k1, float* s0, float* s1) {
  // every loop over v fully unrolled: otherwise GCC turns the final stores
  // into a memcpy and keeps the accumulators on the stack, storing all of
  // them at every d (store-bound, half the speed)
  __m256 a[NV], b[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) a[v] = b[v] = _mm256_setzero_ps();
  for (int d = 0; d < HD; ++d) {
    const __m256 x0 = _mm256_broadcast_ss(k0 + d), x1 = _mm256_broadcast_ss(k1 + d);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m256 q = in_register(_mm256_loadu_ps(qt + d * stride + v * 8));
      a[v] = _mm256_fmadd_ps(x0, q, a[v]);
      b[v] = _mm256_fmadd_ps(x1, q, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    _mm256_storeu_ps(s0 + v * 8, a[v]);
    _mm256_storeu_ps(s1 + v * 8, b[v]);
  }
}

#if defined(__AVX512F__)
// Query rows are padded to whole 16-wide vectors, and the scores run on them:
// four keys against NV vectors of 16 rows, 4 x NV accumulators, per dim four
// broadcasts and NV loads for 4 x NV FMAs. On ymm the scores were ~60% of a
// long chunk's attention (8k of context on a Zen 5: ~37 of 60 ms a layer,
// the value pass on zmm ~15).
constexpr int64_t ROW_LANES = 16;
static_assert(KT % 4 == 0, "score rows are written four keys at a time");

template <int HD, int NV>
inline void scores_quad(const float* qt, int64_t stride, const float* const* keys, float* s) {
  __m512 a[4][NV];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) a[j][v] = _mm512_setzero_ps();
  }
  for (int d = 0; d < HD; ++d) {
    __m512 q[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) q[v] = in_register(_mm512_loadu_ps(qt + d * stride + v * 16));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512 x = _mm512_set1_ps(keys[j][d]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) a[j][v] = _mm512_fmadd_ps(x, q[v], a[j][v]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + j * stride + v * 16, a[j][v]);
  }
}

template <int HD>
inline void scores_keys(const float* qt, int64_t vectors, const float* k, int64_t n, float* s) {
  const int64_t stride = vectors * 8;   // floats per row of qt and of s: a multiple of 16
  const int64_t wide = stride / 16;
  for (int64_t j = 0; j < n; j += 4) {
    // keys past n (the last tile's) repeat the last one, into score rows that are never read
    const float* keys[4];
    for (int i = 0; i < 4; ++i) keys[i] = k + std::min<int64_t>(j + i, n - 1) * HD;
    float* out = s + j * stride;
    int64_t v = 0;
    for (; v + 4 <= wide; v += 4) scores_quad<HD, 4>(qt + v * 16, stride, keys, out + v * 16);
    switch (wide - v) {
      case 3: scores_quad<HD, 3>(qt + v * 16, stride, keys, out + v * 16); break;
      case 2: scores_quad<HD, 2>(qt + v * 16, stride, keys, out + v * 16); break;
      case 1: scores_quad<HD, 1>(qt + v * 16, stride, keys, out + v * 16); break;
      default: break;
    }
  }
}
#else
constexpr int64_t ROW_LANES = 8;

template <int HD>
inline void scores_keys(const float* qt, int64_t vectors, const float* k, int64_t n, float* s) {
  const int64_t stride = vectors * 8;   // floats per row of qt and of s
  for (int64_t j = 0; j < n; j += 2) {
    const float* k1 = k + (j + 1 < n ? j + 1 : j) * HD;   // an odd last key is computed twice
    int64_t v = 0;
    for (; v + 6 <= vectors; v += 6)
      scores_pair<HD, 6>(qt + v * 8, stride, k + j * HD, k1, s + j * stride + v * 8, s + (j + 1) * stride + v * 8);
    switch (vectors - v) {
#define PPA_REST(NV) case NV: scores_pair<HD, NV>(qt + v * 8, stride, k + j * HD, k1, s + j * stride + v * 8, \
                                                  s + (j + 1) * stride + v * 8); break;
      PPA_REST(5) PPA_REST(4) PPA_REST(3) PPA_REST(2) PPA_REST(1)
#undef PPA_REST
      default: break;
    }
  }
}
#endif

// acc rows r and r+1 ([HD] each) = acc * alpha + sum_j p[j][r] v[j], a quarter
// of a 128-dim row (or half of a 64-dim one) at a time: 8 accumulators, the V
// row's 4 vectors loaded once for both rows
template <int HD>
inline void accumulate_pair(float* acc0, float* acc1, float alpha0, float alpha1, const float* p, int64_t stride,
                            const float* v, int64_t n) {
  for (int part = 0; part < HD; part += 32) {
    __m256 a[4], b[4];
    const __m256 s0 = _mm256_set1_ps(alpha0), s1 = _mm256_set1_ps(alpha1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc0 + part + i * 8), s0);
      b[i] = _mm256_mul_ps(_mm256_loadu_ps(acc1 + part + i * 8), s1);
    }
    for (int64_t j = 0; j < n; ++j) {
      const __m256 p0 = _mm256_broadcast_ss(p + j * stride), p1 = _mm256_broadcast_ss(p + j * stride + 1);
      const float* row = v + j * HD + part;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256 x = in_register(_mm256_loadu_ps(row + i * 8));
        a[i] = _mm256_fmadd_ps(p0, x, a[i]);
        b[i] = _mm256_fmadd_ps(p1, x, b[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(acc0 + part + i * 8, a[i]);
      _mm256_storeu_ps(acc1 + part + i * 8, b[i]);
    }
  }
}

#if defined(__AVX512F__)
// The same for four rows (consecutive [HD] rows of acc, their probabilities
// p[j * stride + q]) on 16-wide vectors, 64 dims at a time: 16 accumulators,
// the V row's 4 vectors loaded once for the four rows. Half the FMAs of the
// 8-wide pairs for the same work (the value pass is most of a chunk's time).
template <int HD>
inline void accumulate_quad(float* acc, const float* alphas, const float* p, int64_t stride, const float* v,
                            int64_t n) {
  static_assert(HD % 64 == 0, "64 dims per part");
  for (int part = 0; part < HD; part += 64) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m512 scale = _mm512_set1_ps(alphas[q]);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[q][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + q * HD + part + i * 16), scale);
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* row = v + j * HD + part;
      __m512 x[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) x[i] = in_register(_mm512_loadu_ps(row + i * 16));
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const __m512 pq = _mm512_set1_ps(p[j * stride + q]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a[q][i] = _mm512_fmadd_ps(pq, x[i], a[q][i]);
      }
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + q * HD + part + i * 16, a[q][i]);
    }
  }
}
#endif

// The decode attention's AVX-512 path for fp32 caches: a part of
// paged_decode_attention.cpp, included inside its namespace where the
// compiler targets AVX-512 (it uses that file's BlockPrefetch, Stream,
// fold_block and exp8_nonpositive).
#pragma once

// 16 vectors of 16 partial sums → one vector of their 16 totals (lane r:
// the sum of v[r]'s lanes): 30 shuffles and 15 adds, against a horizontal
// sum per row
inline __m512 reduce16(__m512* v) {
  __m512 x[4];
  for (int i = 0; i < 4; ++i) {
    __m512* w = v + 4 * i;
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
    // each 128-bit lane j: rows 4i..4i+3, summed over that lane's four floats
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __m512 exp16_nonpositive(__m512 x) {
  const __m256 lo = exp8_nonpositive(_mm512_castps512_ps256(x));
  const __m256 hi = exp8_nonpositive(_mm512_extractf32x8_ps(x, 1));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// attend_avx2 on zmm for an fp32 cache, HD a multiple of 16 (64, 128), in
// chunks of 16 keys: each row's dot products accumulate across its 16
// lanes and the 16 rows reduce together (reduce16), and the values' rows
// are weighted by a broadcast into two sets of accumulators (so that their
// FMA chains are half as long). On the AMX machine (blocks shuffled over the
// cache, 30 layers, 2 threads; the kernel reads memory most of the time)
// against attend_avx2 on ymm: 64 x 200 tokens 30.0 -> 29.0 ms, 16 x 1500 55.0
// -> 53.0, 4 x 2000 16.8 -> 15.5.
template <int HD>
void attend_avx512(const float* q, int64_t group, const float* const* k_blocks, const float* const* v_blocks,
                   int64_t ctx, int64_t block_size, const Stream& stream, float* maxima, float* totals, float* acc) {
  constexpr int V = HD / 16;
  constexpr int64_t CHUNK = 16;
  const int64_t num_blocks = (ctx + block_size - 1) / block_size;
  const int64_t block_bytes = block_size * HD * sizeof(float);
  stream.start(k_blocks, v_blocks, num_blocks, block_bytes);
  alignas(64) float probs[CHUNK];
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t n = std::min(block_size, ctx - b * block_size);
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
    // one step at every four scored rows and at every row of values
    BlockPrefetch fetch = stream.ahead(k_blocks, v_blocks, b, block_bytes, group * (n / 4 + n));
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t t0 = c * CHUNK, rows = std::min(CHUNK, n - t0);
      const float* k = k_blocks[b] + t0 * HD;
      const float* v = v_blocks[b] + t0 * HD;
      const __mmask16 valid = static_cast<__mmask16>(rows == CHUNK ? 0xffff : (1u << rows) - 1);
      for (int64_t g = 0; g < group; ++g) {
        __m512 qr[V];
        for (int j = 0; j < V; ++j) qr[j] = _mm512_loadu_ps(q + g * HD + j * 16);
        __m512 dots[CHUNK];
        for (int r = 0; r < CHUNK; ++r) {
          if ((r & 3) == 0) fetch.step();
          __m512 a = _mm512_setzero_ps();
          if (r < rows) {
            for (int j = 0; j < V; ++j) a = _mm512_fmadd_ps(qr[j], _mm512_loadu_ps(k + r * HD + j * 16), a);
          }
          dots[r] = a;
        }
        const __m512 scores = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), reduce16(dots));
        const float maximum = std::max(maxima[g], _mm512_reduce_max_ps(scores));
        const __m512 p = exp16_nonpositive(_mm512_sub_ps(scores, _mm512_set1_ps(maximum)));
        _mm512_store_ps(probs, p);
        const float chunk_total = _mm512_reduce_add_ps(p);
        float* ag = acc + g * HD;
        const __m512 r = _mm512_set1_ps(fold_block(maxima[g], totals[g], maximum, chunk_total));
        __m512 a0[V], a1[V];
        for (int j = 0; j < V; ++j) {
          a0[j] = _mm512_mul_ps(_mm512_loadu_ps(ag + j * 16), r);
          a1[j] = _mm512_setzero_ps();
        }
        int64_t u = 0;
        for (; u + 2 <= rows; u += 2) {
          fetch.step();
          fetch.step();
          const __m512 p0 = _mm512_set1_ps(probs[u]), p1 = _mm512_set1_ps(probs[u + 1]);
          for (int j = 0; j < V; ++j) {
            a0[j] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v + u * HD + j * 16), a0[j]);
            a1[j] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v + (u + 1) * HD + j * 16), a1[j]);
          }
        }
        if (u < rows) {
          fetch.step();
          const __m512 p0 = _mm512_set1_ps(probs[u]);
          for (int j = 0; j < V; ++j) a0[j] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v + u * HD + j * 16), a0[j]);
        }
        for (int j = 0; j < V; ++j) _mm512_storeu_ps(ag + j * 16, _mm512_add_ps(a0[j], a1[j]));
      }
    }
    fetch.finish();
  }
}

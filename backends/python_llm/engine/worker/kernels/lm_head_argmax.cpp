// Greedy decoding's LM head fused with its argmax (CPU, fp32).
//
// For a batch of greedy rows the engine needs one token id per row, not the
// [rows, vocab] logits: written by a GEMM and read back by an argmax they
// are 12.5 MB per step at 64 rows x 49k vocabulary, twice through memory.
// Here each thread walks its own slice of the vocabulary four weight rows at
// a time; the four rows stay in L1 while every hidden row (in L2) is dotted
// with them, and each logit goes straight into its row's running maximum.
// The weights are read from memory once, the logits never exist.
//
// Each logit is a dot product over `dim` in 8 fp32 lanes (FMA) summed at the
// end: the same fp32 arithmetic as a GEMM, in a different order, so a logit
// may differ from MKL's in its last bits. Ties and NaN follow torch.argmax
// (first maximum; a NaN counts as the maximum, the first NaN wins).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LHA_HAVE_AVX2 1
#endif

namespace {

constexpr int TILE_ROWS = 3;      // hidden rows per tile
constexpr int TILE_VOCAB = 4;     // weight rows per tile: 12 accumulators + 3 inputs + 1 weight = 16 ymm

struct Best {
  float value;
  int64_t index;   // -1: nothing seen yet
};

// torch.argmax's order: a NaN beats everything but an earlier NaN; otherwise
// strictly greater wins (the earlier index stays on ties)
inline bool better(float value, const Best& best) {
  if (best.index < 0) return true;
  if (std::isnan(best.value)) return false;
  return value > best.value || std::isnan(value);
}

#if LHA_HAVE_AVX2
inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 shuffled = _mm_movehdup_ps(sum);
  sum = _mm_add_ps(sum, shuffled);
  shuffled = _mm_movehl_ps(shuffled, sum);
  return _mm_cvtss_f32(_mm_add_ss(sum, shuffled));
}

// the four sums of a, b, c, d in one vector (three hadds instead of four
// separate reductions)
inline __m128 horizontal_sums4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
}

template <int R, int C>
void dot_tile(const float* hidden, int64_t hidden_stride, const float* weight, int64_t weight_stride, int64_t dim,
              float out[TILE_ROWS][TILE_VOCAB]) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= dim; k += 8) {
    __m256 h[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) h[r] = _mm256_loadu_ps(hidden + r * hidden_stride + k);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m256 w = _mm256_loadu_ps(weight + c * weight_stride + k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(h[r], w, acc[r][c]);
    }
  }
  if constexpr (C == 4) {
    if (k == dim) {
      for (int r = 0; r < R; ++r) _mm_storeu_ps(out[r], horizontal_sums4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
      return;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float sum = horizontal_sum(acc[r][c]);
      for (int64_t j = k; j < dim; ++j) sum += hidden[r * hidden_stride + j] * weight[c * weight_stride + j];
      out[r][c] = sum;
    }
}
#else
template <int R, int C>
void dot_tile(const float* hidden, int64_t hidden_stride, const float* weight, int64_t weight_stride, int64_t dim,
              float out[TILE_ROWS][TILE_VOCAB]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float sum = 0.f;
      for (int64_t j = 0; j < dim; ++j) sum += hidden[r * hidden_stride + j] * weight[c * weight_stride + j];
      out[r][c] = sum;
    }
}
#endif

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float[TILE_ROWS][TILE_VOCAB]);

template <int R>
constexpr TileFn tile_for(int columns) {
  switch (columns) {
    case 1: return dot_tile<R, 1>;
    case 2: return dot_tile<R, 2>;
    case 3: return dot_tile<R, 3>;
    default: return dot_tile<R, 4>;
  }
}

TileFn tile_function(int rows, int columns) {
  switch (rows) {
    case 1: return tile_for<1>(columns);
    case 2: return tile_for<2>(columns);
    default: return tile_for<3>(columns);
  }
}

// vocabulary rows [begin, end) against every hidden row; best[r] is updated in
// increasing vocabulary order
void scan_vocabulary(const float* hidden, int64_t rows, int64_t hidden_stride, const float* weight,
                     int64_t weight_stride, int64_t dim, int64_t begin, int64_t end, Best* best) {
  float logits[TILE_ROWS][TILE_VOCAB];
  for (int64_t v = begin; v < end; v += TILE_VOCAB) {
    const int columns = static_cast<int>(std::min<int64_t>(TILE_VOCAB, end - v));
    const float* w = weight + v * weight_stride;
    if (v + 2 * TILE_VOCAB <= end) {   // the tile after next: its first lines are on their way meanwhile
      const char* next = reinterpret_cast<const char*>(w + 2 * TILE_VOCAB * weight_stride);
      for (int c = 0; c < TILE_VOCAB; ++c) __builtin_prefetch(next + c * weight_stride * 4, 0, 3);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(TILE_ROWS, rows - r0));
      tile_function(tile_rows, columns)(hidden + r0 * hidden_stride, hidden_stride, w, weight_stride, dim, logits);
      for (int r = 0; r < tile_rows; ++r)
        for (int c = 0; c < columns; ++c)
          if (better(logits[r][c], best[r0 + r])) best[r0 + r] = Best{logits[r][c], v + c};
    }
  }
}

}  // namespace

extern "C" {

// out_ids[r] = argmax over v of dot(hidden[r, :dim], weight[v, :dim]). Rows
// of both inputs are contiguous; strides are in floats. Returns 0, or 1 when
// an argument is out of range.
int lm_head_argmax_f32(const float* hidden, int64_t rows, int64_t hidden_stride, const float* weight,
                       int64_t vocab, int64_t weight_stride, int64_t dim, int64_t* out_ids, int num_threads) {
  if (rows < 0 || vocab < 1 || dim < 1 || num_threads < 1) return 1;
  if (rows == 0) return 0;
  // each thread gets a contiguous slice of the vocabulary (a multiple of the
  // tile width), so merging the slices in thread order keeps the first maximum
  const int64_t tiles = (vocab + TILE_VOCAB - 1) / TILE_VOCAB;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, tiles));
  std::vector<Best> partial(static_cast<size_t>(threads) * rows, Best{0.f, -1});
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int64_t begin = std::min(vocab, tiles * t / threads * TILE_VOCAB);
    const int64_t end = std::min(vocab, tiles * (t + 1) / threads * TILE_VOCAB);
    scan_vocabulary(hidden, rows, hidden_stride, weight, weight_stride, dim, begin, end, &partial[t * rows]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    Best best{0.f, -1};
    for (int t = 0; t < threads; ++t) {
      const Best& candidate = partial[t * rows + r];
      if (candidate.index >= 0 && better(candidate.value, best)) best = candidate;
    }
    out_ids[r] = best.index;
  }
  return 0;
}

}

// Greedy decoding's LM head in int16, its argmax exact by a bound (CPU).
//
// CPUs without bf16 dot products (AVX2: Zen 3, older Intel) run the fp32 LM
// head at the FMA peak, and it is a sixth of a 64-row decode step on the
// default model (49k x 576). AVX2's vpmaddwd multiplies 16 int16 pairs in one
// instruction, twice fp32's multiplies per cycle, from half the bytes. Its
// logits are approximate, so, as for the bf16 head (verified_argmax.cpp),
// they only choose the candidates that are dotted again in fp64.
//
// Quantization: weight row v is s_v (wq_v + d_v), |wq| <= 1023 (11 bits,
// packed once); hidden row r is s_r (hq_r + e_r), |hq| <= A (each call; 12
// bits, fewer where dim * A * 1023 would pass 2^31), d and e the exact
// residuals. The integer dot is exact in int32 (vpmaddwd: the products and
// their pair sums are exact; the sum over dim stays below 2^31). Then
//
//   exact - s_r s_v (hq . wq) = s_r s_v (hq . d + e . wq + e . d)
//   |...| <= s_r ||hq|| * s_v ||d|| + s_r ||e|| * s_v (||wq|| + ||d||)
//          = m1_r P_v + m2_r Q_v                        (Cauchy-Schwarz)
//
// P and Q are the packed weight's (rounded up, P with a slack of 2^-18 Q for
// this kernel's own fp32 roundings: |approx| <= m1 Q); m1 and m2 are
// computed here in fp64 and rounded up. On SmolLM2-135M's hidden states
// (max |h| ~9x their RMS) a row keeps 1 candidate on average, at most ~6
// (int8's vpmaddubsw, at the same multiplies per cycle, kept ~500: 8 bits
// are too few for the bound).
//
// A row whose hidden state is not all finite gets -1: the caller decides it
// the fp32 way (torch.argmax's NaN rule).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "verified_candidates.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define I16H_HAVE_AVX2 1
#endif

namespace {

constexpr int64_t TILE_VOCAB = 16;   // two ymm of int32 lanes, one per vocabulary row
constexpr int64_t PAIR = 2;          // the k values one int32 lane sums (vpmaddwd)
constexpr int64_t STEP = TILE_VOCAB * PAIR;   // int16 of one k pair of a tile: [16][2]
constexpr int TILE_ROWS = 5;         // 10 accumulators + 2 weights + a broadcast + 2 products
constexpr int FLOOR_LANES = 8;       // a row's largest lower end, kept per lane until the end
constexpr double WEIGHT_LEVELS = 1023.0;
constexpr double MOST_HIDDEN_LEVELS = 2047.0;
constexpr double ROUND_UP = 1.0 + 1.0 / (1 << 20);

inline int64_t pairs_of(int64_t dim) { return (dim + PAIR - 1) / PAIR; }
inline int64_t padded_rows(int64_t vocab) { return (vocab + TILE_VOCAB - 1) / TILE_VOCAB * TILE_VOCAB; }

// |hq| <= levels keeps every integer dot below 2^31: dim * levels * 1023 < 2^31
inline double hidden_levels(int64_t dim) {
  return std::min(MOST_HIDDEN_LEVELS, std::floor(2147483647.0 / (static_cast<double>(pairs_of(dim) * PAIR) * WEIGHT_LEVELS)));
}

// x = s (q + residual) with |q| <= levels, q written as int16; returns
// (s, ||q||, ||residual||), the last rounded up for the fp64 quotient's error
// (< |x / s| 2^-52 <= 2^-41 a term)
struct Quantized {
  float scale;
  double q_norm, residual_norm;
};

Quantized quantize(const float* x, int64_t n, double levels, int16_t* q) {
  float largest = 0.f;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(x[i]));
  if (largest == 0.f) {   // all zero: every product is exactly 0
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return {0.f, 0.0, 0.0};
  }
  const float s = static_cast<float>(largest / levels);
  const float inverse = static_cast<float>(levels / largest);
  const float top = static_cast<float>(levels);
  double q_squares = 0.0, residual_squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    // any integer near x / s will do: the residual is computed from it
    const float value = std::clamp(std::nearbyint(x[i] * inverse), -top, top);
    q[i] = static_cast<int16_t>(value);
    const double residual = static_cast<double>(x[i]) / s - value;
    q_squares += static_cast<double>(value) * value;
    residual_squares += residual * residual;
  }
  return {s, std::sqrt(q_squares), std::sqrt(residual_squares) + std::sqrt(static_cast<double>(n)) * std::ldexp(1.0, -41)};
}

// the hidden rows quantized: [rows][pairs] int16 pairs (one int32 each) and
// each row's scale, m1 = s ||hq||, m2 = s ||e|| (rounded up), finiteness
struct QuantizedRows {
  std::vector<int32_t> pairs;
  std::vector<float> scale, m1, m2;
  std::vector<char> finite;

  QuantizedRows(const float* hidden, int64_t rows, int64_t hidden_stride, int64_t dim)
      : pairs(rows * pairs_of(dim), 0), scale(rows, 0.f), m1(rows, 0.f), m2(rows, 0.f), finite(rows, 0) {
    const double levels = hidden_levels(dim);
    for (int64_t r = 0; r < rows; ++r) {
      const float* h = hidden + r * hidden_stride;
      bool ok = true;
      for (int64_t i = 0; i < dim; ++i) ok = ok && std::isfinite(h[i]);
      finite[r] = ok;
      if (!ok) continue;   // its pairs stay 0; the caller decides it the fp32 way
      const Quantized q = quantize(h, dim, levels, reinterpret_cast<int16_t*>(&pairs[r * pairs_of(dim)]));
      scale[r] = q.scale;
      m1[r] = static_cast<float>(q.scale * q.q_norm * ROUND_UP);
      m2[r] = static_cast<float>(q.scale * q.residual_norm * ROUND_UP);
    }
  }
};

// The integer dots of R hidden rows against one tile of 16 vocabulary rows.
// packed: the tile's [pairs][16][2] int16; hidden[r]: row r's int16 pairs.
#if I16H_HAVE_AVX2
// acc += x in acc's own register: GCC otherwise adds into x's and copies
// back, a move per accumulator per step
inline __m256i add_in_place(__m256i acc, __m256i x) {
  __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(x));
  return acc;
}

template <int R>
void dot_tile(const int16_t* packed, int64_t pairs, const int32_t* const* hidden, int32_t acc_out[TILE_ROWS][TILE_VOCAB]) {
  __m256i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t g = 0; g < pairs; ++g) {
    // the tiles are contiguous: 2 KiB ahead runs into the next one (few rows
    // stream the weights from memory: 1.32 -> 1.21 ms at one row, 1.65 ->
    // 1.26 at four; 1 and 4 KiB were no better)
    _mm_prefetch(reinterpret_cast<const char*>(packed + g * STEP) + 2048, _MM_HINT_T0);
    __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + g * STEP));
    __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + g * STEP + 16));
    // in registers: folded into each vpmaddwd, the loads (8 of w + 4
    // broadcasts a pair) bound the loop on two load ports, not the multiplies
    __asm__("" : "+x"(w0), "+x"(w1));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i h = _mm256_set1_epi32(hidden[r][g]);
      acc[r][0] = add_in_place(acc[r][0], _mm256_madd_epi16(h, w0));
      acc[r][1] = add_in_place(acc[r][1], _mm256_madd_epi16(h, w1));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc_out[r]), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc_out[r] + 8), acc[r][1]);
  }
}
#else
template <int R>
void dot_tile(const int16_t* packed, int64_t pairs, const int32_t* const* hidden, int32_t acc_out[TILE_ROWS][TILE_VOCAB]) {
  for (int r = 0; r < R; ++r) {
    const int16_t* h = reinterpret_cast<const int16_t*>(hidden[r]);
    for (int64_t j = 0; j < TILE_VOCAB; ++j) {
      int32_t sum = 0;
      for (int64_t g = 0; g < pairs; ++g)
        for (int64_t b = 0; b < PAIR; ++b) sum += static_cast<int32_t>(h[g * PAIR + b]) * packed[g * STEP + j * PAIR + b];
      acc_out[r][j] = sum;
    }
  }
}
#endif

using TileFn = void (*)(const int16_t*, int64_t, const int32_t* const*, int32_t[TILE_ROWS][TILE_VOCAB]);

TileFn tile_function(int rows) {
  switch (rows) {
    case 1: return dot_tile<1>;
    case 2: return dot_tile<2>;
    case 3: return dot_tile<3>;
    case 4: return dot_tile<4>;
    default: return dot_tile<5>;
  }
}

// tile row r's approximate logits into out (16), its lower ends into floor's lanes
#if I16H_HAVE_AVX2
inline void finish_tile_row(const int32_t* acc, float s, float m1, float m2, const float* scales,
                            const float* p_factor, const float* q_factor, float* out, float* floor) {
  const __m256 row_scale = _mm256_set1_ps(s), a1 = _mm256_set1_ps(m1), a2 = _mm256_set1_ps(m2);
  __m256 lanes = _mm256_loadu_ps(floor);
  for (int j = 0; j < TILE_VOCAB; j += 8) {
    const __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + j))),
                                   _mm256_mul_ps(row_scale, _mm256_loadu_ps(scales + j)));
    _mm256_storeu_ps(out + j, a);
    const __m256 margin = _mm256_fmadd_ps(a1, _mm256_loadu_ps(p_factor + j), _mm256_mul_ps(a2, _mm256_loadu_ps(q_factor + j)));
    lanes = _mm256_max_ps(lanes, _mm256_sub_ps(a, margin));
  }
  _mm256_storeu_ps(floor, lanes);
}
#else
inline void finish_tile_row(const int32_t* acc, float s, float m1, float m2, const float* scales,
                            const float* p_factor, const float* q_factor, float* out, float* floor) {
  for (int64_t j = 0; j < TILE_VOCAB; ++j) {
    const float a = static_cast<float>(acc[j]) * (s * scales[j]);
    out[j] = a;
    floor[j % FLOOR_LANES] = std::max(floor[j % FLOOR_LANES], a - (m1 * p_factor[j] + m2 * q_factor[j]));
  }
}
#endif

// approximate logits of tiles [tile_begin, tile_end) into approx, and each
// row's lower ends into floors [rows][FLOOR_LANES]
void approximate_tiles(const QuantizedRows& q, int64_t rows, int64_t pairs, const int16_t* packed,
                       const float* scales, const float* p_factor, const float* q_factor, int64_t tile_begin,
                       int64_t tile_end, float* approx, int64_t approx_stride, float* floors) {
  alignas(32) int32_t acc[TILE_ROWS][TILE_VOCAB];
  const int32_t* hidden_rows[TILE_ROWS];
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t v0 = tile * TILE_VOCAB;
    const int16_t* weights = packed + tile * pairs * STEP;
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(TILE_ROWS, rows - r0));
      for (int r = 0; r < tile_rows; ++r) hidden_rows[r] = q.pairs.data() + (r0 + r) * pairs;
      tile_function(tile_rows)(weights, pairs, hidden_rows, acc);
      for (int r = 0; r < tile_rows; ++r) {
        const int64_t row = r0 + r;
        finish_tile_row(acc[r], q.scale[row], q.m1[row], q.m2[row], scales + v0, p_factor + v0, q_factor + v0,
                        approx + row * approx_stride + v0, floors + row * FLOOR_LANES);
      }
    }
  }
}

// the exact argmax among the logits whose upper end reaches the floor
int64_t decide_row(const float* approx, const float* hidden, const float* weight, int64_t weight_stride,
                   const float* p_factor, const float* q_factor, float m1, float m2, float floor, int64_t vocab,
                   int64_t dim, int64_t* num_candidates) {
  verified::ExactArgmax best(hidden, weight, weight_stride, dim);
  int64_t v = 0;
#if I16H_HAVE_AVX2
  const __m256 f = _mm256_set1_ps(floor), a1 = _mm256_set1_ps(m1), a2 = _mm256_set1_ps(m2);
  for (; v + 8 <= vocab; v += 8) {
    const __m256 margin = _mm256_fmadd_ps(a1, _mm256_loadu_ps(p_factor + v),
                                          _mm256_mul_ps(a2, _mm256_loadu_ps(q_factor + v)));
    unsigned reaches = static_cast<unsigned>(_mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_add_ps(_mm256_loadu_ps(approx + v), margin), f, _CMP_GE_OQ)));
    while (reaches) {
      best.consider(v + __builtin_ctz(reaches));
      reaches &= reaches - 1;
    }
  }
#endif
  for (; v < vocab; ++v)
    if (approx[v] + (m1 * p_factor[v] + m2 * q_factor[v]) >= floor) best.consider(v);
  *num_candidates = best.candidates();
  return best.token();
}

}  // namespace

extern "C" {

// 1 when this build multiplies int16 on AVX2 lanes (the int16 head's speed)
int int16_lm_head_supported() {
#if I16H_HAVE_AVX2
  return 1;
#else
  return 0;
#endif
}

// int16 elements of the packed weight of a [vocab, dim] LM head
int64_t int16_lm_head_packed_elements(int64_t vocab, int64_t dim) {
  return padded_rows(vocab) / TILE_VOCAB * pairs_of(dim) * STEP;
}

// rows of the per-row arrays (scales, bound factors) and of the scratch: the
// vocabulary rounded up to whole tiles
int64_t int16_lm_head_padded_rows(int64_t vocab) { return padded_rows(vocab); }

// Quantizes weight [vocab, dim] (row stride in floats) into packed
// [tiles][pairs][16][2] int16 and, per padded row (vocab rounded up to 16):
// scales, p_factor and q_factor (the bound's P and Q, rounded up; a huge P
// for the padding rows, so that their lower ends never count). Returns 1 when
// a weight is not finite, else 0.
int int16_lm_head_pack(const float* weight, int64_t vocab, int64_t dim, int64_t weight_stride, int16_t* packed,
                       float* scales, float* p_factor, float* q_factor, int num_threads) {
  const int64_t pairs = pairs_of(dim);
  const int64_t padded = padded_rows(vocab);
  int not_finite = 0;
#pragma omp parallel for num_threads(num_threads) schedule(static) reduction(| : not_finite)
  for (int64_t v = 0; v < padded; ++v) {
    int16_t* lane = packed + v / TILE_VOCAB * pairs * STEP + v % TILE_VOCAB * PAIR;
    for (int64_t g = 0; g < pairs; ++g) lane[g * STEP] = lane[g * STEP + 1] = 0;
    if (v >= vocab) {
      scales[v] = 0.f; p_factor[v] = 1e30f; q_factor[v] = 0.f;
      continue;
    }
    const float* w = weight + v * weight_stride;
    bool finite = true;
    for (int64_t i = 0; i < dim; ++i) finite = finite && std::isfinite(w[i]);
    if (!finite) {
      not_finite = 1;
      continue;
    }
    std::vector<int16_t> q(dim);
    const Quantized quantized = quantize(w, dim, WEIGHT_LEVELS, q.data());
    for (int64_t i = 0; i < dim; ++i) lane[i / PAIR * STEP + i % PAIR] = q[i];
    const double q_exact = quantized.scale * (quantized.q_norm + quantized.residual_norm);
    scales[v] = quantized.scale;
    q_factor[v] = static_cast<float>(q_exact * ROUND_UP);
    p_factor[v] = static_cast<float>((quantized.scale * quantized.residual_norm + std::ldexp(q_exact, -18)) * ROUND_UP);
  }
  return not_finite;
}

// out[r] = the exact argmax of hidden[r] . weight[v] over v < vocab, from the
// packed int16 copy; -1 where a hidden row is not finite. approx: scratch of
// [rows, vocab rounded up to 16] floats. candidates[r]: how many logits were
// dotted again (1: none). Returns 1 when an argument is out of range, else 0.
int int16_lm_head_argmax(const float* hidden, int64_t rows, int64_t hidden_stride, const int16_t* packed,
                         const float* scales, const float* p_factor, const float* q_factor, const float* weight,
                         int64_t weight_stride, int64_t vocab, int64_t dim, float* approx, int64_t* out,
                         int64_t* candidates, int num_threads) {
  if (rows < 0 || vocab < 1 || dim < 1 || hidden_levels(dim) < 1.0 || num_threads < 1) return 1;
  if (rows == 0) return 0;
  const int64_t pairs = pairs_of(dim);
  const int64_t stride = padded_rows(vocab), tiles = stride / TILE_VOCAB;
  const QuantizedRows q(hidden, rows, hidden_stride, dim);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, tiles));
  std::vector<float> floors(static_cast<size_t>(threads) * rows * FLOOR_LANES, -std::numeric_limits<float>::infinity());
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    approximate_tiles(q, rows, pairs, packed, scales, p_factor, q_factor, tiles * t / threads,
                      tiles * (t + 1) / threads, approx, stride, &floors[t * rows * FLOOR_LANES]);
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; ++r) {
      candidates[r] = 0;
      if (!q.finite[r]) { out[r] = -1; continue; }
      float floor = -std::numeric_limits<float>::infinity();
      for (int u = 0; u < threads; ++u)
        for (int lane = 0; lane < FLOOR_LANES; ++lane) floor = std::max(floor, floors[(u * rows + r) * FLOOR_LANES + lane]);
      out[r] = decide_row(approx + r * stride, hidden + r * hidden_stride, weight, weight_stride, p_factor, q_factor,
                          q.m1[r], q.m2[r], floor, vocab, dim, candidates + r);
    }
  }
  return 0;
}

}

// fp32 projections on AVX2 / FMA lanes with the weight packed once.
//
// On the 2-core AVX2 machines (AMD EPYC, Zen 3) one core's FMA pipes give
// ~89 GFLOP/s (a register-only loop, measured), while oneDNN's packed fp32
// inner product reaches 55-80 GFLOP/s on the decoder's shapes at 64 rows and
// ~100-120 at 512 (bench/step_profile.py, docs/benchmarks.md). This is the
// classic BLIS structure for those shapes:
//   - the weight [n, k] packed once into panels of NR = two registers of
//     columns (16 floats on AVX2), each panel k rows of NR floats (zero
//     columns past n), so a thread streams its own panels front to back and
//     every weight byte comes from memory once;
//   - the activations packed per call into blocks of MR = 6 rows, k columns of
//     6 floats, so the micro-kernel's broadcasts read one sequential stream;
//   - a 6 x 16 micro-kernel: 12 ymm accumulators, per k two weight loads, six
//     broadcasts and 12 FMAs; K in blocks of KC so a panel's slice stays in L1
//     while every row block passes, rows in blocks of MC so theirs stay in L2;
//   - the next panel's slice prefetched while the row blocks pass over this one
//     (64 rows x 3072 columns: 81 -> 107 GFLOP/s);
//   - up to one pass of rows (MC) a step is bound by reading the weight, not
//     by its FMAs: there each panel's K passes run in turn, so a thread's
//     panels are one sequential stream, and the first row block prefetches a
//     fixed distance ahead in it, one line a k. On the Zen 3 (30 distinct
//     weights of each decoder shape, one process, interleaved with the old
//     order; bits unchanged) a decode step's projections took 4 rows 19.6-21.1
//     ms instead of 27.2-29.8, 8 rows 22.5-25.3 instead of 31.1-34.1, 16 rows
//     31.8-39.4 instead of 36.0-48.2, 32 rows 55.8-66.4 instead of 63.6-72.4,
//     64 rows ahead in 5 of 6 runs (by 1-17%, behind by 3% once); at 48 and
//     96 rows the two orders were within the machine's noise. With only the
//     first row block prefetching, memory sat idle while the later blocks
//     reused the slice from L1: a pass took about its reads plus its FMAs.
//     So every row block also prefetches its share of the next slice into
//     L2 (from 4 rows). On the AMX machine (zmm, 30 distinct weights of each
//     shape; docs/benchmarks.md) 4 rows took 19.6-19.9 ms instead of
//     20.9-21.3, 16 rows 23.3-23.6 instead of 28.4-28.5, 32 rows 30.2-30.7
//     instead of 39.7-40.0, 64 rows 47-49 instead of 60; 1-2 rows unchanged.
//     Into L1 instead it was slower (16 rows 30.7 against 28.2): the next
//     slice pushed the current one out.
// Results are an fp32 GEMM's up to summation order (as oneDNN's against MKL's).
//
// Where the compiler targets AVX-512 the same code runs on zmm registers: an
// 8 x 32 micro-kernel, 16 accumulators. On the 2-core Zen 5 machines (full
// 512-bit FMA pipes, ~470 GFLOP/s peak measured) it reached 370-390 GFLOP/s
// at 64 rows against oneDNN's 300-385, but fell behind it at 16 rows and from
// 128. On the Zen 4 (double-pumped zmm) a decode step of one sequence took
// 22-26 ms on it against 30-36 on oneDNN, whose dispatch costs ~40-65 us a
// call inside a step (120 calls), and the offline workload ran 1.09x; from 128
// rows it was 2-7% behind (docs/benchmarks.md). So the caller runs it below
// 128 rows on zmm (`fma_gemm_vector_floats`), and at every size on ymm:
// on the Zen 3 it matched or beat oneDNN from 64 to 2048 rows once the
// panels went to the first thread free (a prefill step of 512 tokens 0.92x).
//
// Built only where the compiler targets AVX2 + FMA (-march=native);
// elsewhere `fma_gemm_supported` says 0.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#define FMA_GEMM 1
#include <immintrin.h>
#endif

namespace {

#if FMA_GEMM
// One vector register of floats, the widest the build targets.
#if defined(__AVX512F__)
struct Lanes {
  using V = __m512;
  static constexpr int64_t W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
};
// rows of an activation block: 16 of the 32 zmm accumulate; 8 measured best
// of 6 / 8 / 12 / 14 at 16-128 rows (Zen 5)
constexpr int64_t MR = 8;
#else
struct Lanes {
  using V = __m256;
  static constexpr int64_t W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_load_ps(p); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
};
constexpr int64_t MR = 6;     // rows of an activation block: 12 of the 16 ymm accumulate
#endif
constexpr int64_t NR = 2 * Lanes::W;   // columns of a weight panel (two registers)
#else
constexpr int64_t NR = 16, MR = 6;
#endif
// K of one pass: a panel's slice is 12 KiB (ymm) or 24 KiB (zmm), in L1.
// 192 measured best of 192 / 256 / 288 / 576 on the decoder's shapes
// (K = 576 and 1536) on AVX2; on AVX-512 128 and 192 about equal, 288 and
// 576 behind.
constexpr int64_t KC = 192;
// rows of one pass: 96 x 192 floats = 72 KiB (L2); 96 measured best of 96 / 192 / 288
constexpr int64_t MC = 96;
// runs of panels per thread, handed out dynamically (see fma_gemm_f32):
// 2 measured best of 1 / 2 / 4 / 8 on the Zen 3
constexpr int64_t ITEMS_PER_THREAD = 2;
// How far ahead of the line a k reads the few-rows order prefetches (into
// L1: one line a k is a steady trickle, not a burst). 1, 2, 4 and 8 KiB
// measured alike on the Zen 3 (64 lines in flight are enough for one core).
constexpr int64_t STREAM_AHEAD_BYTES = 4096;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#if FMA_GEMM
// Where one micro-kernel call's results go: rows x cols of out (and of the
// residual), bias by column. `first`: the K pass that starts the sums;
// `last`: the one that adds bias and residual.
struct Tile {
  float* out;
  int64_t out_stride;
  const float* bias;
  const float* residual;
  int64_t residual_stride;
  int64_t rows, cols;
  bool first, last;
};

// Prefetches of a micro-kernel call in the few-rows order of fma_gemm_f32,
// where the weight is read as one sequential stream: each k, the bytes
// [l1 + k * l1_step, + l1_step) into L1 and [l2 + k * l2_step, + l2_step)
// into L2 (a line, or two where a step is two lines), as the call's TO_L1 /
// TO_L2 say
struct Ahead {
  const char* l1 = nullptr;
  int64_t l1_step = 0;
  const char* l2 = nullptr;
  int64_t l2_step = 0;
};

template <int HINT>
inline void prefetch_span(const char* p, int64_t step, int64_t k) {
  _mm_prefetch(p + k * step, static_cast<_mm_hint>(HINT));
  if (step > 64) _mm_prefetch(p + k * step + 64, static_cast<_mm_hint>(HINT));
}

template <int ROWS, bool TO_L1, bool TO_L2>
inline void micro_kernel(const float* a, const float* b, int64_t kc, const Tile& t, const Ahead& ahead) {
  using L = Lanes;
  constexpr int64_t W = L::W;
  typename L::V acc[ROWS][2];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = L::zero();
  for (int64_t k = 0; k < kc; ++k) {
    if constexpr (TO_L1) prefetch_span<_MM_HINT_T0>(ahead.l1, ahead.l1_step, k);
    if constexpr (TO_L2) prefetch_span<_MM_HINT_T1>(ahead.l2, ahead.l2_step, k);
    const typename L::V b0 = L::load(b + k * NR), b1 = L::load(b + k * NR + W);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const typename L::V x = L::broadcast(a + k * MR + r);
      acc[r][0] = L::fmadd(x, b0, acc[r][0]);
      acc[r][1] = L::fmadd(x, b1, acc[r][1]);
    }
  }
  // through a buffer: indexing the accumulators by the runtime row count
  // would make the compiler keep them in memory inside the loop above
  alignas(64) float sums[ROWS][NR];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    L::store(sums[r], acc[r][0]);
    L::store(sums[r] + W, acc[r][1]);
  }
  if (t.cols == NR) {
    const typename L::V bias0 = t.last && t.bias ? L::loadu(t.bias) : L::zero();
    const typename L::V bias1 = t.last && t.bias ? L::loadu(t.bias + W) : L::zero();
    for (int64_t r = 0; r < t.rows; ++r) {
      float* row = t.out + r * t.out_stride;
      typename L::V v0 = L::load(sums[r]), v1 = L::load(sums[r] + W);
      if (!t.first) {
        v0 = L::add(L::loadu(row), v0);
        v1 = L::add(L::loadu(row + W), v1);
      }
      if (t.last) {
        v0 = L::add(v0, bias0);
        v1 = L::add(v1, bias1);
        if (t.residual) {
          const float* res = t.residual + r * t.residual_stride;
          v0 = L::add(v0, L::loadu(res));
          v1 = L::add(v1, L::loadu(res + W));
        }
      }
      L::storeu(row, v0);
      L::storeu(row + W, v1);
    }
    return;
  }
  // the last panel of an n that is not a multiple of NR
  for (int64_t r = 0; r < t.rows; ++r) {
    float* row = t.out + r * t.out_stride;
    for (int64_t c = 0; c < t.cols; ++c) {
      float v = sums[r][c];
      if (!t.first) v = row[c] + v;
      if (t.last) {
        if (t.bias) v += t.bias[c];
        if (t.residual) v += t.residual[r * t.residual_stride + c];
      }
      row[c] = v;
    }
  }
}

template <bool TO_L1, bool TO_L2, int ROWS = MR>
inline void micro_kernel_rows(int64_t rows, const float* a, const float* b, int64_t kc, const Tile& t,
                              const Ahead& ahead = Ahead{}) {
  if constexpr (ROWS == 1) {
    micro_kernel<1, TO_L1, TO_L2>(a, b, kc, t, ahead);
  } else if (rows == ROWS) {
    micro_kernel<ROWS, TO_L1, TO_L2>(a, b, kc, t, ahead);
  } else {
    micro_kernel_rows<TO_L1, TO_L2, ROWS - 1>(rows, a, b, kc, t, ahead);
  }
}
#endif
}  // namespace

extern "C" {

int fma_gemm_supported() {
#if FMA_GEMM
  return 1;
#else
  return 0;
#endif
}

// floats in one of this build's vector registers: 8 (ymm), 16 (zmm); 0 without AVX2 / FMA
int fma_gemm_vector_floats() {
#if FMA_GEMM
  return static_cast<int>(Lanes::W);
#else
  return 0;
#endif
}

// floats of a packed [n, k] weight
int64_t fma_gemm_packed_elements(int64_t n, int64_t k) { return ceil_div(n, NR) * NR * k; }

// weight [n, k] (row stride in floats) into `packed` (fma_gemm_packed_elements):
// panel j, row kk, column c at (j * k + kk) * NR + c
void fma_gemm_pack_weight(const float* weight, int64_t weight_stride, int64_t n, int64_t k, float* packed,
                          int num_threads) {
  const int64_t panels = ceil_div(n, NR);
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t j = 0; j < panels; ++j) {
    float* panel = packed + j * k * NR;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t c = 0; c < NR; ++c) {
        const int64_t row = j * NR + c;
        panel[kk * NR + c] = row < n ? weight[row * weight_stride + kk] : 0.0f;
      }
    }
  }
}

// out[m, n] = x[m, k] @ weight.T (+ bias[n]) (+ residual[m, n]); bias and
// residual may be null; `packed` must be 64-byte aligned. Returns 0, or 1
// when this build has no AVX2 / FMA.
int fma_gemm_f32(const float* x, int64_t x_stride, int64_t m, const float* packed, int64_t n, int64_t k,
                 const float* bias, const float* residual, int64_t residual_stride, float* out, int64_t out_stride,
                 int num_threads) {
#if FMA_GEMM
  if (m <= 0 || n <= 0) return 0;
  const int64_t blocks = ceil_div(m, MR), panels = ceil_div(n, NR);
  thread_local std::vector<float> a_storage;
  a_storage.resize(static_cast<size_t>(blocks * MR * k));
  float* a = a_storage.data();
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, panels)));
#pragma omp parallel num_threads(threads)
  {
    // block i, column kk, row r at (i * k + kk) * MR + r (zero rows past m)
#pragma omp for schedule(static)
    for (int64_t i = 0; i < blocks; ++i) {
      float* block = a + i * k * MR;
      for (int64_t r = 0; r < MR; ++r) {
        const int64_t row = i * MR + r;
        if (row < m) {
          const float* source = x + row * x_stride;
          for (int64_t kk = 0; kk < k; ++kk) block[kk * MR + r] = source[kk];
        } else {
          for (int64_t kk = 0; kk < k; ++kk) block[kk * MR + r] = 0.0f;
        }
      }
    }
    // implicit barrier: the packed rows are all written before any is read.
    // The panels go out in ITEMS_PER_THREAD runs a thread, each to the first
    // thread free. With half the panels owned by each thread (static), two
    // threads lost 10-25% against two single-thread processes on a 2-core
    // Zen 3; handed out so, 5-15% faster at 32-250 rows on the decoder's
    // shapes, 576x576 unchanged (docs/benchmarks.md, "Issue 18 on the Zen 3
    // again"; zmm builds unmeasured). A run keeps all its panels' K passes
    // on one thread, so no tile of `out` is summed by two.
    //
    // The runs are near-equal, the longer ones first, so that the thread
    // that takes the last one does not finish alone: runs of a fixed length
    // left a short last one (18 panels of 576 columns in runs 4, 4, 4, 4, 2:
    // one thread had 10 panels, the other 8); runs 5, 5, 4, 4 give 9 and 9.
    const int64_t items = std::min<int64_t>(panels, threads * ITEMS_PER_THREAD);
    const int64_t per_item = panels / items, longer = panels % items;   // the first `longer` take one more
    // row block i x panel j, for the K pass from k0 (kc deep)
    const auto tile_at = [&](int64_t i, int64_t j, int64_t k0, int64_t kc) {
      return Tile{out + i * MR * out_stride + j * NR, out_stride, bias ? bias + j * NR : nullptr,
                  residual ? residual + i * MR * residual_stride + j * NR : nullptr, residual_stride,
                  std::min(MR, m - i * MR), std::min(NR, n - j * NR), k0 == 0, k0 + kc == k};
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t first = item * per_item + std::min(item, longer);
      const int64_t last = first + per_item + (item < longer ? 1 : 0);
      if (blocks <= MC / MR) {
        // Few rows (all in one pass): each panel's K passes in turn, so the
        // run's panels are read front to back as one stream. The first row
        // block prefetches into L1 a fixed distance ahead in it. Every block
        // also prefetches its share of the next slice into L2 (block i the
        // i-th of `blocks` parts), so that memory streams while the later
        // blocks reuse this slice from L1; a block of up to 3 rows alone is
        // bound by the reads, and the L1 stream alone was as fast there.
        // Bits as below: each tile's passes keep their K order on one thread.
        for (int64_t j = first; j < last; ++j) {
          for (int64_t k0 = 0; k0 < k; k0 += KC) {
            const int64_t kc = std::min(KC, k - k0);
            const float* b = packed + (j * k + k0) * NR;
            const char* next = reinterpret_cast<const char*>(b + kc * NR);
            for (int64_t i = 0; i < blocks; ++i) {
              const Tile tile = tile_at(i, j, k0, kc);
              const Ahead ahead{reinterpret_cast<const char*>(b) + STREAM_AHEAD_BYTES, NR * 4,
                                next + i * kc * NR * 4 / blocks, NR * 4 / blocks};
              const float* rows = a + (i * k + k0) * MR;
              if (i > 0) micro_kernel_rows<false, true>(tile.rows, rows, b, kc, tile, ahead);
              else if (m > 3) micro_kernel_rows<true, true>(tile.rows, rows, b, kc, tile, ahead);
              else micro_kernel_rows<true, false>(tile.rows, rows, b, kc, tile, ahead);
            }
          }
        }
        continue;
      }
      for (int64_t m0 = 0; m0 < blocks; m0 += MC / MR) {
        const int64_t m_end = std::min(blocks, m0 + MC / MR);
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
          const int64_t kc = std::min(KC, k - k0);
          for (int64_t j = first; j < last; ++j) {
            const float* b = packed + (j * k + k0) * NR;
            // the next panel's slice (kc x NR floats, in lines of 64 bytes),
            // spread over this panel's row blocks, so it is in cache when its
            // first block starts. Into L2 (T1), not L1: with one or two row
            // blocks the spread is a burst of hundreds of lines, which overruns
            // L1's miss buffers; on a Zen 4 (30 cold weights, ms T0 -> T1)
            // 3072x576 at 8 rows 19.7 -> 11.8 on ymm, 13.3 -> 11.1 on zmm, at
            // 64 rows 42.4 -> 41.9 and 47.2 -> 38.9; no shape or row count of
            // 1-64 slower (docs/benchmarks.md)
            const char* next = reinterpret_cast<const char*>(b + k * NR);
            const int64_t lines = kc * NR * 4 / 64;
            const int64_t per_block = j + 1 < last ? ceil_div(lines, m_end - m0) : 0;
            for (int64_t i = m0; i < m_end; ++i) {
              for (int64_t line = (i - m0) * per_block; line < std::min(lines, (i - m0 + 1) * per_block); ++line) {
                _mm_prefetch(next + line * 64, _MM_HINT_T1);
              }
              const Tile tile = tile_at(i, j, k0, kc);
              micro_kernel_rows<false, false>(tile.rows, a + (i * k + k0) * MR, b, kc, tile);
            }
          }
        }
      }
    }
  }
  return 0;
#else
  (void)x; (void)x_stride; (void)m; (void)packed; (void)n; (void)k; (void)bias; (void)residual;
  (void)residual_stride; (void)out; (void)out_stride; (void)num_threads;
  return 1;
#endif
}

}

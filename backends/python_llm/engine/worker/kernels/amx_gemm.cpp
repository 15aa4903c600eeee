// fp32 projections on AMX tiles by three-way bf16 splitting ("bf16x3").
//
// On a CPU with AMX-BF16 one core multiplies bf16 tiles at ~3.4 TFLOP/s
// (measured on the 2-core Xeon machines) against ~200 GFLOP/s for fp32 FMA.
// bf16 alone would lose 16 bits of every weight and activation; instead each
// fp32 value is split exactly into three bf16 parts, x = x0 + x1 + x2 (8
// significant bits each: 24 in all, fp32's mantissa), and a product is the
// sum of the six partial products down to 2^-16 of the leading one:
//   a b ~ a0 b0 + a0 b1 + a1 b0 + a0 b2 + a1 b1 + a2 b0
// The dropped terms are below 2^-24 of a b, fp32's own rounding; AMX
// accumulates in fp32. So a result is an fp32 GEMM's up to summation order,
// like MKL's against oneDNN's, at six tile products per tile of work.
//
// Layouts (bf16 tiles of 1 KiB; KS = K / 32 rounded up, zero padded):
//   weights, packed once: N tile j (16 columns), K step s, part p at
//     ((j * KS + s) * 3 + p) * 512, each tile in AMX's pair-interleaved
//     (VNNI) order: row r = k pair, element 2 c + e = W[16 j + c][32 s + 2 r + e]
//   activations, converted per call: M tile i (16 rows) the same way, plain
//     row-major tiles (row = m, 32 k).
// A block of 2 x 2 C tiles starts from the residual (or the bias) and is
// stored straight to the output; blocks cut by m or n, or with both, go
// through a 16 x 16 buffer where bias and residual are added.
//
// Built only where the compiler targets AMX-BF16 and AVX512-BF16
// (-march=native on such a CPU); elsewhere `amx_gemm_supported` says 0.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <omp.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define AMX_GEMM 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t TILE = 16;          // rows of an A / C tile, columns of a B / C tile
constexpr int64_t KSTEP = 32;         // K of one tile (bf16)
constexpr int64_t PARTS = 3;
constexpr int64_t TILE_ELEMS = 512;   // bf16 in a tile
// A thread's weight panel stays in its L2 (2 MB on every AMX CPU) while all
// the row pairs' tiles stream past: at least three column pairs, so that a
// row pair's tiles, read from L3 for the panel, serve three (with one, the
// MLP's down projection, K = 1536 at 288 KiB a pair, read them for a single
// use: 512 rows x 30 layers 72 -> 60 ms), else 256 KiB. A panel of up to
// PREFETCH_PANEL_BYTES fetches the next one into L2 as it runs: the first
// row pair alone reads a panel from memory, and memory sat idle while the
// others ran (K = 576 shapes at 128-256 rows 5-15% faster; a panel of the
// down projection plus the next one crowds the L2: 4-8% slower).
constexpr int64_t PANEL_BYTES = 256 << 10;
constexpr int64_t MIN_PANEL_PAIRS = 3;
constexpr int64_t PREFETCH_PANEL_BYTES = 512 << 10;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t n_tiles(int64_t n) { return 2 * ceil_div(n, 2 * TILE); }   // even: blocks of two
inline int64_t k_steps(int64_t k) { return ceil_div(k, KSTEP); }

// The panels a thread has not started yet, [first, end): the thread takes
// from the front, a thread with none left steals from the back.
struct alignas(64) PanelRange {
  std::atomic<uint64_t> bounds{0};   // first in the low 32 bits, end in the high

  void reset(int64_t first, int64_t end) {
    bounds.store(static_cast<uint64_t>(end) << 32 | static_cast<uint64_t>(first), std::memory_order_relaxed);
  }
  int64_t take(bool front) {
    uint64_t b = bounds.load(std::memory_order_relaxed);
    while (true) {
      const uint64_t first = b & 0xffffffffu, end = b >> 32;
      if (first >= end) return -1;
      const uint64_t taken = front ? (end << 32 | (first + 1)) : ((end - 1) << 32 | first);
      if (bounds.compare_exchange_weak(b, taken, std::memory_order_relaxed)) {
        return static_cast<int64_t>(front ? first : end - 1);
      }
    }
  }
};

// thread t's next panel: its own front, else another's back; -1 when none is left
int64_t claim(PanelRange* ranges, int threads, int t) {
  const int64_t own = ranges[t].take(true);
  if (own >= 0) return own;
  for (int d = 1; d < threads; ++d) {
    const int64_t stolen = ranges[(t + d) % threads].take(false);
    if (stolen >= 0) return stolen;
  }
  return -1;
}

// round to nearest even, as _mm512_cvtneps_pbh and PyTorch do
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// x = parts[0] + parts[1] + parts[2]
inline void split3(float x, uint16_t* parts) {
  for (int p = 0; p < PARTS; ++p) {
    parts[p] = to_bf16(x);
    x -= from_bf16(parts[p]);
  }
}

#if AMX_GEMM
constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr long XFEATURE_XTILEDATA = 18;

bool request_amx() {
  static const bool granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: C (2 x 2 of 16 x 16 fp32), 4-5: A (two M tiles), 6-7: B (two N tiles)
void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// One row's 32 values of K step s into its row of the three part tiles.
inline void split_row_step(const float* row, int64_t k, int64_t s, uint16_t* tile_row_p0) {
  const int64_t k0 = s * KSTEP;
  const int64_t valid = std::min<int64_t>(KSTEP, k - k0);
  const __mmask16 lo = static_cast<__mmask16>(valid >= 16 ? 0xffff : (1u << std::max<int64_t>(valid, 0)) - 1);
  const __mmask16 hi = static_cast<__mmask16>(valid >= 32 ? 0xffff : valid <= 16 ? 0 : (1u << (valid - 16)) - 1);
  __m512 x0 = _mm512_maskz_loadu_ps(lo, row + k0);
  __m512 x1 = _mm512_maskz_loadu_ps(hi, row + k0 + 16);
  for (int p = 0; p < PARTS; ++p) {
    const __m256bh b0 = _mm512_cvtneps_pbh(x0), b1 = _mm512_cvtneps_pbh(x1);
    uint16_t* target = tile_row_p0 + p * TILE_ELEMS;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(target), (__m256i)b0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(target + 16), (__m256i)b1);
    const __m512 back0 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32((__m256i)b0), 16));
    const __m512 back1 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32((__m256i)b1), 16));
    x0 = _mm512_sub_ps(x0, back0);
    x1 = _mm512_sub_ps(x1, back1);
  }
}

// C tiles 0-3 += the six partial products of K step s
inline void step_products(const uint16_t* a_top, const uint16_t* a_bottom, const uint16_t* b_left,
                          const uint16_t* b_right) {
  constexpr int64_t STRIDE = 64;   // bytes per tile row
  // (A part, B part) pairs with pa + pb <= 2, grouped by A part so that its
  // loaded tiles serve all of its products: a0 b0, a0 b1, a0 b2, a1 b0, a1 b1, a2 b0
  for (int pa = 0; pa < PARTS; ++pa) {
    _tile_loadd(4, a_top + pa * TILE_ELEMS, STRIDE);
    _tile_loadd(5, a_bottom + pa * TILE_ELEMS, STRIDE);
    for (int pb = 0; pa + pb < PARTS; ++pb) {
      _tile_loadd(6, b_left + pb * TILE_ELEMS, STRIDE);
      _tile_loadd(7, b_right + pb * TILE_ELEMS, STRIDE);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// C tiles 0-3 (rows row0.., columns col0..) start from the residual or the
// bias, so that a full block's tiles go straight to `out`: storing them to a
// buffer and adding with vector loads cost 7-9% of a 512-row projection.
// False (tiles zeroed) where the block is cut by m or n, or has both.
inline bool start_tiles(int64_t row0, int64_t col0, int64_t m, int64_t n, const float* bias, const float* residual,
                        int64_t residual_stride) {
  const bool direct = row0 + 2 * TILE <= m && col0 + 2 * TILE <= n && !(bias && residual);
  if (direct && residual) {
    const float* r = residual + row0 * residual_stride + col0;
    const int64_t stride = residual_stride * 4;
    _tile_loadd(0, r, stride);
    _tile_loadd(1, r + TILE, stride);
    _tile_loadd(2, r + TILE * residual_stride, stride);
    _tile_loadd(3, r + TILE * residual_stride + TILE, stride);
  } else if (direct && bias) {   // stride 0: every row of the tile is the bias
    _tile_loadd(0, bias + col0, 0);
    _tile_loadd(1, bias + col0 + TILE, 0);
    _tile_loadd(2, bias + col0, 0);
    _tile_loadd(3, bias + col0 + TILE, 0);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  return direct;
}

// out[row0 + r, col0 + c] = C + bias + residual for the rows and columns that exist
inline void store_tile(const float* tile, int64_t row0, int64_t col0, int64_t m, int64_t n, const float* bias,
                       const float* residual, int64_t residual_stride, float* out, int64_t out_stride) {
  const int64_t rows = std::min(TILE, m - row0), cols = std::min(TILE, n - col0);
  if (rows <= 0 || cols <= 0) return;
  const __mmask16 mask = static_cast<__mmask16>(cols == 16 ? 0xffff : (1u << cols) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col0) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(tile + r * TILE), b);
    if (residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + (row0 + r) * residual_stride + col0));
    _mm512_mask_storeu_ps(out + (row0 + r) * out_stride + col0, mask, v);
  }
}
#endif

}  // namespace

extern "C" {

// 1 when this build and this process can run the AMX GEMM (the kernel grants
// the tile state), else 0.
int amx_gemm_supported() {
#if AMX_GEMM
  return request_amx() ? 1 : 0;
#else
  return 0;
#endif
}

// bf16 elements of a packed [n, k] weight
int64_t amx_gemm_packed_elements(int64_t n, int64_t k) { return n_tiles(n) * k_steps(k) * PARTS * TILE_ELEMS; }

// weight [n, k] (row stride in floats) into `packed` (amx_gemm_packed_elements)
void amx_gemm_pack_weight(const float* weight, int64_t weight_stride, int64_t n, int64_t k, uint16_t* packed,
                          int num_threads) {
  const int64_t tiles = n_tiles(n), steps = k_steps(k);
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t j = 0; j < tiles; ++j) {
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* base = packed + (j * steps + s) * PARTS * TILE_ELEMS;
      for (int64_t r = 0; r < KSTEP / 2; ++r) {
        for (int64_t c = 0; c < TILE; ++c) {
          for (int64_t e = 0; e < 2; ++e) {
            const int64_t row = j * TILE + c, col = s * KSTEP + 2 * r + e;
            uint16_t parts[PARTS] = {0, 0, 0};
            if (row < n && col < k) split3(weight[row * weight_stride + col], parts);
            for (int64_t p = 0; p < PARTS; ++p) base[p * TILE_ELEMS + r * 2 * TILE + 2 * c + e] = parts[p];
          }
        }
      }
    }
  }
}

// out[m, n] = x[m, k] @ weight.T (+ bias[n]) (+ residual[m, n]); bias and
// residual may be null. Returns 0, or 1 when AMX is not available.
int amx_gemm_f32(const float* x, int64_t x_stride, int64_t m, const uint16_t* packed, int64_t n, int64_t k,
                 const float* bias, const float* residual, int64_t residual_stride, float* out, int64_t out_stride,
                 int num_threads) {
#if AMX_GEMM
  if (!request_amx()) return 1;
  if (m <= 0) return 0;
  const int64_t steps = k_steps(k), row_tiles = 2 * ceil_div(m, 2 * TILE), col_blocks = n_tiles(n) / 2;
  // the activations' parts, row tiles x K steps x 3 tiles (zero rows past m)
  // 64-byte aligned: a tile's rows are then whole cache lines (the vector's
  // own 16-byte alignment cost 8-10% at 512 rows)
  thread_local std::vector<uint16_t> parts;
  parts.resize(static_cast<size_t>(row_tiles * steps * PARTS * TILE_ELEMS) + 32);
  uint16_t* a = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(parts.data()) + 63) & ~uintptr_t{63});
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, col_blocks)));
  const int64_t pair_elems = 2 * steps * PARTS * TILE_ELEMS;   // a column pair's tiles
  const int64_t panel_pairs = std::max<int64_t>(MIN_PANEL_PAIRS, PANEL_BYTES / (pair_elems * 2));
  const bool prefetch = panel_pairs * pair_elems * 2 <= PREFETCH_PANEL_BYTES;
  const int64_t panels = ceil_div(col_blocks, panel_pairs);
  const std::unique_ptr<PanelRange[]> ranges(new PanelRange[threads]);
  for (int t = 0; t < threads; ++t) ranges[t].reset(panels * t / threads, panels * (t + 1) / threads);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t row = 0; row < row_tiles * TILE; ++row) {
      const int64_t i = row / TILE, r = row % TILE;
      for (int64_t s = 0; s < steps; ++s) {
        uint16_t* tile_row = a + (i * steps + s) * PARTS * TILE_ELEMS + r * KSTEP;
        if (row < m) {
          split_row_step(x + row * x_stride, k, s, tile_row);
        } else {
          for (int64_t p = 0; p < PARTS; ++p) std::memset(tile_row + p * TILE_ELEMS, 0, KSTEP * 2);
        }
      }
    }
    // implicit barrier: every part is written before any tile reads it
    configure_tiles();
    // Panels of column pairs stay in L2 while every row pair streams past (a
    // row pair's A tiles in L1 / L2 across the panel). Each thread runs its
    // own share of them front to back, one stream of weights, and claims
    // the next panel before it starts one, so that its weights can be
    // fetched meanwhile. A thread done early takes the others' last panels:
    // with fixed shares, whatever else ran on a core (tritonserver, the
    // other stubs) stalled the whole GEMM. Each block is summed by one
    // thread in K order, so the bits never depend on the threads.
    const int t = omp_get_thread_num();
    alignas(64) float c_tile[4][TILE * TILE];
    for (int64_t panel = claim(ranges.get(), threads, t); panel >= 0;) {
      const int64_t p0 = panel * panel_pairs, p_end = std::min(col_blocks, p0 + panel_pairs);
      const int64_t ahead_panel = claim(ranges.get(), threads, t);
      // the next panel, a share of its lines at every K step of this one
      const int64_t a0 = ahead_panel >= 0 ? ahead_panel * panel_pairs : col_blocks;
      const char* ahead = reinterpret_cast<const char*>(packed + a0 * pair_elems);
      const char* ahead_end = reinterpret_cast<const char*>(packed + std::min(col_blocks, a0 + panel_pairs) * pair_elems);
      const int64_t lines_per_step =
          prefetch ? ceil_div(ceil_div(ahead_end - ahead, 64), (row_tiles / 2) * (p_end - p0) * steps) : 0;
      for (int64_t i = 0; i < row_tiles; i += 2) {
        for (int64_t jb = p0; jb < p_end; ++jb) {
          const int64_t j = 2 * jb;
          const bool direct = start_tiles(i * TILE, j * TILE, m, n, bias, residual, residual_stride);
          const uint16_t* b_left = packed + j * steps * PARTS * TILE_ELEMS;
          const uint16_t* b_right = b_left + steps * PARTS * TILE_ELEMS;
          for (int64_t s = 0; s < steps; ++s) {
            for (int64_t line = 0; line < lines_per_step && ahead < ahead_end; ++line, ahead += 64) {
              _mm_prefetch(ahead, _MM_HINT_T1);
            }
            step_products(a + (i * steps + s) * PARTS * TILE_ELEMS, a + ((i + 1) * steps + s) * PARTS * TILE_ELEMS,
                          b_left + s * PARTS * TILE_ELEMS, b_right + s * PARTS * TILE_ELEMS);
          }
          if (direct) {
            float* o = out + i * TILE * out_stride + j * TILE;
            const int64_t stride = out_stride * 4;
            _tile_stored(0, o, stride);
            _tile_stored(1, o + TILE, stride);
            _tile_stored(2, o + TILE * out_stride, stride);
            _tile_stored(3, o + TILE * out_stride + TILE, stride);
            continue;
          }
          _tile_stored(0, c_tile[0], 64);
          _tile_stored(1, c_tile[1], 64);
          _tile_stored(2, c_tile[2], 64);
          _tile_stored(3, c_tile[3], 64);
          for (int q = 0; q < 4; ++q) {
            store_tile(c_tile[q], (i + q / 2) * TILE, (j + q % 2) * TILE, m, n, bias, residual, residual_stride,
                       out, out_stride);
          }
        }
      }
      panel = ahead_panel;
    }
    _tile_release();
  }
  return 0;
#else
  (void)x; (void)x_stride; (void)m; (void)packed; (void)n; (void)k; (void)bias; (void)residual;
  (void)residual_stride; (void)out; (void)out_stride; (void)num_threads;
  return 1;
#endif
}

}

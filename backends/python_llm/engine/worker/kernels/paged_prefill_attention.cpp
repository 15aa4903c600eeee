// Causal attention of a prefill chunk over the paged K/V cache, in place (CPU).
//
// The PyTorch path for a chunk that continues a cached prefix gathers every
// block of the context into a contiguous copy, in every layer, and builds a
// dense [chunk, context] mask for SDPA: at 8k tokens of context that copy is
// ~12 MB a layer, a fixed cost of every step however small its chunk. Here
// each (KV head, tile of chunk tokens) walks the block table and reads the
// cached rows where they are (the chunk's own K/V are written to the cache
// before attention, so the whole context is there): flash-attention style,
// 16 keys at a time, running maximum and sum per query row, the causal limit
// applied only on the tiles that cross it. GQA: the query heads that share a
// KV head are rows of the same tile, so each K/V tile is read once for all.
// The queries are held transposed ([head_dim, rows]), so the key rows are
// used as they lie in the cache (no transpose per tile) and the softmax
// runs across eight query rows per vector. A chunk of one tile (up to 32
// tokens past 1k of context: what pacing gives a long prompt late in its
// prefill) splits its context between
// the threads instead, merged afterwards, so that each head's K/V is read
// once. fp32 accumulation whatever the cache dtype.
//
// Plain C ABI (no PyTorch headers), loaded with ctypes, like the decode kernel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "cache_elements.h"
#include "fast_exp.h"

namespace {

constexpr int KT = 16;      // keys per tile
// chunk tokens per work item: more items balance the threads and waste less
// of the causal triangle at short contexts; at long ones a bigger tile reads
// each K/V tile for more queries (measured, 30 layers, 2 threads: 20 tokens
// at 7.5k of context 92 -> 80 ms with 32, 256 tokens at 256 16.3 -> 19.2 ms)
constexpr int QT_SHORT = 16;
constexpr int QT_LONG = 32;
constexpr int64_t LONG_CONTEXT = 1024;   // chunk start from which QT_LONG is used
constexpr int64_t MIN_SPLIT_KEYS = 512;   // keys per part when a small chunk's context is split

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PPA_HAVE_AVX2 1

#include "paged_prefill_attention_tiles.h"

// a tile of keys as floats: in place for fp32, converted into `buffer` otherwise
template <int HD>
inline const float* tile_floats(const float* src, int64_t, float*) { return src; }
template <int HD, typename T>
inline const float* tile_floats(const T* src, int64_t n, float* buffer) {
  for (int64_t i = 0; i < n * HD; i += 8) _mm256_storeu_ps(buffer + i, load8(src + i));
  return buffer;
}

// The next tile's K and V (`elements` each) fetched into L2 while this one
// is worked on: its block lies anywhere in the cache (the table's order), so
// the hardware prefetcher would start on it only after its first misses.
// On a Zen 4 (30 layers at 7k of context, 2 threads, blocks shuffled): 512
// tokens 1.09x, 112 tokens 1.05x; into L1 1.04x, two or four tiles ahead no
// better than one.
template <typename T>
inline void prefetch_tile(const T* k, const T* v, int64_t elements) {
  const char* pk = reinterpret_cast<const char*>(k);
  const char* pv = reinterpret_cast<const char*>(v);
  for (int64_t byte = 0; byte < elements * static_cast<int64_t>(sizeof(T)); byte += 64) {
    __builtin_prefetch(pk + byte, 0, 2);
    __builtin_prefetch(pv + byte, 0, 2);
  }
}

struct Scratch {
  std::vector<float> qt, acc, scores, kbuf, vbuf, limits;
  std::vector<float> maxima, sums, alphas;
};

// Where a work item's results go: normalised into `out`, or, when the
// context is split between items, its running maxima, sums and unnormalised
// accumulators for merge_splits ([rows], [rows], [rows, HD]).
struct Partial {
  float* maxima = nullptr;
  float* sums = nullptr;
  float* acc = nullptr;
};

// One work item: KV head `h`, chunk tokens t0 .. t0+qt-1 (positions start+t),
// over the key tiles [tile_begin, tile_end) of their context.
// Query rows r = token * group + head-in-group, padded to whole vectors of 8.
template <int HD, typename T>
void attend_tile(T* out, int64_t out_row_stride, const T* query, int64_t q_row_stride, const T* k_head,
                 const T* v_head, const int32_t* table, int64_t block_size, int64_t start, int64_t t0, int64_t qt,
                 int64_t h, int64_t group, float scale, int64_t tile_begin, int64_t tile_end, Partial partial,
                 Scratch& w) {
  const int64_t rows = qt * group;
  const int64_t padded = (rows + ROW_LANES - 1) / ROW_LANES * ROW_LANES, vectors = padded / 8;
  w.qt.assign(HD * padded, 0.f);
  w.acc.assign(padded * HD, 0.f);
  w.scores.resize(KT * padded);
  w.limits.resize(padded);
  w.maxima.assign(padded, -INFINITY);
  w.sums.assign(padded, 0.f);
  w.alphas.resize(padded);
  for (int64_t r = 0; r < padded; ++r) {
    // padding rows see everything (zero queries: harmless) and are never written out
    w.limits[r] = r < rows ? static_cast<float>(start + t0 + r / group) : INFINITY;
    if (r >= rows) continue;
    const T* src = query + (t0 + r / group) * q_row_stride + (h * group + r % group) * HD;
    for (int d = 0; d < HD; ++d) w.qt[d * padded + r] = to_float(src[d]) * scale;
  }
  const int64_t block_stride = block_size * HD;
  const int64_t first_limit = start + t0;        // last key the item's first token sees
  const int64_t end = start + t0 + qt;           // keys 0 .. end-1 are seen by some row
  const int64_t tile_keys = std::min<int64_t>(KT, block_size);
  float* s = w.scores.data();
  const int64_t k_end = std::min(end, tile_end * tile_keys);
  for (int64_t k0 = tile_begin * tile_keys; k0 < k_end; k0 += tile_keys) {
    const int64_t n = std::min(tile_keys, k_end - k0);
    const int64_t base = static_cast<int64_t>(table[k0 / block_size]) * block_stride + (k0 % block_size) * HD;
    if (const int64_t k1 = k0 + tile_keys; k1 < k_end) {
      const int64_t next = static_cast<int64_t>(table[k1 / block_size]) * block_stride + (k1 % block_size) * HD;
      prefetch_tile(k_head + next, v_head + next, tile_keys * HD);
    }
    const float* k = tile_floats<HD>(k_head + base, n, w.kbuf.data());
    const float* v = tile_floats<HD>(v_head + base, n, w.vbuf.data());
    scores_keys<HD>(w.qt.data(), vectors, k, n, s);
    const bool crosses = k0 + n - 1 > first_limit;   // some key is past some row's limit
    for (int64_t vec = 0; vec < vectors; ++vec) {
      const __m256 limit = _mm256_loadu_ps(w.limits.data() + vec * 8);
      __m256 tile_max = _mm256_set1_ps(-INFINITY);
      for (int64_t j = 0; j < n; ++j) {
        __m256 x = _mm256_loadu_ps(s + j * padded + vec * 8);
        if (crosses) {
          const __m256 hidden = _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(k0 + j)), limit, _CMP_GT_OQ);
          x = _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), hidden);
          _mm256_storeu_ps(s + j * padded + vec * 8, x);
        }
        tile_max = _mm256_max_ps(tile_max, x);
      }
      const __m256 old_max = _mm256_loadu_ps(w.maxima.data() + vec * 8);
      // -inf for a row that has seen no key yet (a split past its limit):
      // then alpha and p come out as exp8_nonpositive(NaN) = e^-87 ~ 0 (exp8 clamps a
      // NaN to -87), the masked p as 0, and its sum and accumulator stay 0
      const __m256 new_max = _mm256_max_ps(old_max, tile_max);
      const __m256 alpha = exp8_nonpositive(_mm256_sub_ps(old_max, new_max));
      __m256 total = _mm256_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const __m256 x = _mm256_loadu_ps(s + j * padded + vec * 8);
        __m256 p = exp8_nonpositive(_mm256_sub_ps(x, new_max));
        if (crosses) p = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), p);
        _mm256_storeu_ps(s + j * padded + vec * 8, p);
        total = _mm256_add_ps(total, p);
      }
      _mm256_storeu_ps(w.maxima.data() + vec * 8, new_max);
      _mm256_storeu_ps(w.sums.data() + vec * 8,
                       _mm256_fmadd_ps(_mm256_loadu_ps(w.sums.data() + vec * 8), alpha, total));
      _mm256_storeu_ps(w.alphas.data() + vec * 8, alpha);
    }
#if defined(__AVX512F__)
    for (int64_t r = 0; r < padded; r += 4)   // padded is a multiple of 8
      accumulate_quad<HD>(w.acc.data() + r * HD, w.alphas.data() + r, s + r, padded, v, n);
#else
    for (int64_t r = 0; r < padded; r += 2)
      accumulate_pair<HD>(w.acc.data() + r * HD, w.acc.data() + (r + 1) * HD, w.alphas[r], w.alphas[r + 1],
                          s + r, padded, v, n);
#endif
  }
  if (partial.acc != nullptr) {
    std::copy_n(w.maxima.data(), rows, partial.maxima);
    std::copy_n(w.sums.data(), rows, partial.sums);
    std::copy_n(w.acc.data(), rows * HD, partial.acc);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / w.sums[r];
    T* dst = out + (t0 + r / group) * out_row_stride + (h * group + r % group) * HD;
    for (int i = 0; i < HD; ++i) dst[i] = from_float<T>(w.acc[r * HD + i] * inv);
  }
}

// One query row of KV head h from its splits' partials: rescale each to the
// largest maximum and normalise by the rescaled sums (split 0 holds key 0,
// which every row sees, so that maximum is finite).
// `parts`: the splits' arrays of this head, one after the other, each
// [rows] maxima, [rows] sums, [rows, HD] accumulators.
template <int HD, typename T>
void merge_row(T* dst, const float* parts, int64_t splits, int64_t rows, int64_t r) {
  const int64_t stride = rows * (HD + 2);
  float top = -INFINITY;
  for (int64_t k = 0; k < splits; ++k) top = std::max(top, parts[k * stride + r]);
  float total = 0.f, merged[HD] = {};
  for (int64_t k = 0; k < splits; ++k) {
    const float* part = parts + k * stride;
    if (part[r] == -INFINITY) continue;   // a split with nothing this row sees
    const float weight = std::exp(part[r] - top);
    total += weight * part[rows + r];
    const float* acc = part + 2 * rows + r * HD;
    for (int i = 0; i < HD; ++i) merged[i] += weight * acc[i];
  }
  const float inv = 1.f / total;
  for (int i = 0; i < HD; ++i) dst[i] = from_float<T>(merged[i] * inv);
}

template <int HD, typename T>
void prefill_attention(T* out, int64_t out_row_stride, const T* query, int64_t q_row_stride, const T* key_cache,
                       const T* value_cache, const int32_t* table, int64_t num_tokens, int64_t start,
                       int64_t num_heads, int64_t kv_heads, int64_t num_blocks, int64_t block_size, float scale,
                       int num_threads) {
  const int64_t group = num_heads / kv_heads;
  const int64_t threads = std::max(1, num_threads);
  // tokens in tiles of at most QT_SHORT / QT_LONG, as even as possible
  const int64_t qt_max = start >= LONG_CONTEXT ? QT_LONG : QT_SHORT;
  const int64_t tiles = (num_tokens + qt_max - 1) / qt_max;
  const int64_t qt = (num_tokens + tiles - 1) / tiles;
  // A small chunk (a paced one, 16 tokens at 8k of context: as much work as a
  // big chunk at the start) has fewer items than threads x 2: its context is
  // split between items instead of its tokens, so that every thread has work
  // and each head's K/V is read once (split k covers key tiles [k K / S,
  // (k+1) K / S) of all the chunk's tokens; merged afterwards).
  const int64_t tile_keys = std::min<int64_t>(KT, block_size);
  const int64_t key_tiles = (start + num_tokens + tile_keys - 1) / tile_keys;
  int64_t splits = 1;
  if (tiles == 1 && kv_heads < 2 * threads)
    splits = std::clamp<int64_t>((2 * threads + kv_heads - 1) / kv_heads, 1,
                                 std::max<int64_t>(1, key_tiles * tile_keys / MIN_SPLIT_KEYS));
  const int64_t rows = qt * group;
  std::vector<float> partials(splits > 1 ? kv_heads * splits * rows * (HD + 2) : 0);
  const int64_t work = tiles * kv_heads * splits;
  const int64_t head_stride = num_blocks * block_size * HD;
#pragma omp parallel num_threads(num_threads)
  {
    Scratch w;
    w.kbuf.resize(KT * HD);
    w.vbuf.resize(KT * HD);
    // the last tiles (the longest context) first, all heads of a tile
    // together (measured: faster than head by head for chunks of 30-64 tokens)
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < work; ++item) {
      const int64_t tile = tiles - 1 - item / (kv_heads * splits), rest = item % (kv_heads * splits);
      const int64_t h = rest / splits, split = rest % splits;
      const int64_t t0 = tile * qt;
      Partial partial;
      if (splits > 1) {   // then tiles == 1
        float* base = partials.data() + (h * splits + split) * rows * (HD + 2);
        partial = {base, base + rows, base + 2 * rows};
      }
      attend_tile<HD, T>(out, out_row_stride, query, q_row_stride, key_cache + h * head_stride,
                         value_cache + h * head_stride, table, block_size, start, t0,
                         std::min(qt, num_tokens - t0), h, group, scale, split * key_tiles / splits,
                         (split + 1) * key_tiles / splits, partial, w);
    }
    if (splits > 1) {
#pragma omp for schedule(static)
      for (int64_t item = 0; item < kv_heads * rows; ++item) {
        const int64_t h = item / rows, r = item % rows;
        merge_row<HD, T>(out + (r / group) * out_row_stride + (h * group + r % group) * HD,
                         partials.data() + h * splits * rows * (HD + 2), splits, rows, r);
      }
    }
  }
}

template <typename T>
int dispatch(void* out, int64_t out_row_stride, const void* query, int64_t q_row_stride, const void* key_cache,
             const void* value_cache, const int32_t* table, int64_t num_tokens, int64_t start, int64_t num_heads,
             int64_t kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, float scale,
             int num_threads) {
  auto run = [&](auto fn) {
    fn(static_cast<T*>(out), out_row_stride, static_cast<const T*>(query), q_row_stride,
       static_cast<const T*>(key_cache), static_cast<const T*>(value_cache), table, num_tokens, start, num_heads,
       kv_heads, num_blocks, block_size, scale, num_threads);
    return 0;
  };
  if (head_dim == 64) return run(prefill_attention<64, T>);
  if (head_dim == 128) return run(prefill_attention<128, T>);
  return 2;
}
#endif

}  // namespace

extern "C" {

// 1 when paged_prefill_attention runs for this head_dim on this build.
int paged_prefill_attention_supported(int64_t head_dim) {
#ifdef PPA_HAVE_AVX2
  return head_dim == 64 || head_dim == 128;
#else
  (void)head_dim;
  return 0;
#endif
}

// dtype: 0 float32, 1 bfloat16, 2 float16. Token i of the chunk (position
// start + i) attends to cached positions 0 .. start + i. Shapes: out
// [num_tokens, heads*head_dim] (row stride out_row_stride elements), query
// [num_tokens, heads, head_dim] (row stride q_row_stride), caches [kv_heads,
// num_blocks, block_size, head_dim] contiguous and already holding the
// chunk's own K/V, table: the block ids covering start + num_tokens
// positions. The caller checks shapes and block ids. Returns 0, 1 for an
// unknown dtype, 2 for an unsupported head_dim / CPU.
int paged_prefill_attention(int dtype, void* out, int64_t out_row_stride, const void* query, int64_t q_row_stride,
                            const void* key_cache, const void* value_cache, const int32_t* table,
                            int64_t num_tokens, int64_t start, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                            int64_t num_blocks, int64_t block_size, float scale, int num_threads) {
#ifdef PPA_HAVE_AVX2
  switch (dtype) {
    case 0: return dispatch<float>(out, out_row_stride, query, q_row_stride, key_cache, value_cache, table, num_tokens,
                                   start, num_heads, kv_heads, head_dim, num_blocks, block_size, scale, num_threads);
    case 1: return dispatch<bf16>(out, out_row_stride, query, q_row_stride, key_cache, value_cache, table, num_tokens,
                                  start, num_heads, kv_heads, head_dim, num_blocks, block_size, scale, num_threads);
    case 2: return dispatch<_Float16>(out, out_row_stride, query, q_row_stride, key_cache, value_cache, table,
                                      num_tokens, start, num_heads, kv_heads, head_dim, num_blocks, block_size, scale,
                                      num_threads);
    default: return 1;
  }
#else
  (void)dtype; (void)out; (void)out_row_stride; (void)query; (void)q_row_stride; (void)key_cache; (void)value_cache;
  (void)table; (void)num_tokens; (void)start; (void)num_heads; (void)kv_heads; (void)head_dim; (void)num_blocks;
  (void)block_size; (void)scale; (void)num_threads;
  return 2;
#endif
}

}

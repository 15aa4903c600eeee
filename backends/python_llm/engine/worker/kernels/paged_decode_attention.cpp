// Decode attention that reads the paged K/V cache in place (CPU).
//
// The PyTorch path gathers every decode's blocks into a padded copy before
// calling SDPA; on a CPU that copy (and reading it back) is most of the
// attention time. Here each (sequence, KV head) pair walks its block table
// and reads the cached rows where they are, for each query head that shares
// the KV head (GQA: the block is re-read from L1/L2, not from memory).
// fp32 accumulation whatever the cache dtype; online softmax (one pass).
//
// Plain C ABI (no PyTorch headers), loaded with ctypes: it compiles in a few
// seconds with the system C++ compiler.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "cache_elements.h"
#include "fast_exp.h"

namespace {

// rows [group, ctx] of scores → unnormalised probabilities; totals[g] their sums
inline void softmax_rows(float* rows, int64_t group, int64_t ctx, const float* maxima, float* totals) {
  for (int64_t g = 0; g < group; ++g) {
    float* row = rows + g * ctx;
    const float maximum = maxima[g];
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < ctx; ++t) {
      row[t] = exp_nonpositive(row[t] - maximum);
      total += row[t];
    }
    totals[g] = total;
  }
}

// Blocks ahead are fetched into L2, not L1 (prefetcht1), and the fetch of a
// block is spread over the work on the one before it instead of issued in
// one burst of 128 lines: a burst overruns the core's outstanding-miss
// buffers (the likely cause), which then stall the loads the kernel itself
// waits on; the L1 stream prefetcher pulls a block from L2 as it is read. On
// a Zen 4 (30 layers, 64 x 200 / 16 x 768 / 16 x 1500 tokens, 2 threads): 44
// / 47 / 88 ms with bursts into L1, 33 / 29 / 62 with bursts into L2, 26 /
// 21 / 42 spread a third per query head, against 23 / 22 / 42 ms for a plain
// read of the same blocks; spread into L1 34 / 32 / 62, one or three blocks
// ahead no better. Spread finer still, a few lines at every four scored rows
// and every row of values (`BlockPrefetch`): on the AMX machine (AVX-512,
// blocks shuffled over a cache on huge pages) 64 x 200 31.2 -> 29.6 ms, 16 x
// 460 17.1 -> 16.3, 16 x 1500 61 -> 55, 4 x 2000 18.1 -> 17.2, 64 x 64 8.4
// -> 8.2; twice the lines early, one block ahead, or into L1 no better.
#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 2
#endif
inline void prefetch_lines(const void* row, int64_t begin, int64_t end) {
  const char* p = static_cast<const char*>(row);
  for (int64_t line = begin; line < end; ++line) __builtin_prefetch(p + line * 64, 0, 2);
}

// A K and a V block fetched a few lines at a time: `steps` calls of step()
// cover them, finish() whatever is left.
class BlockPrefetch {
 public:
  BlockPrefetch(const void* k, const void* v, int64_t bytes, int64_t steps)
      : k_(k), v_(v), lines_(k ? (bytes + 63) / 64 : 0), per_step_(steps > 0 ? (lines_ + steps - 1) / steps : lines_) {}
  void step() { advance(per_step_); }
  void finish() { advance(lines_); }

 private:
  void advance(int64_t count) {
    const int64_t end = std::min(lines_, next_ + count);
    prefetch_lines(k_, next_, end);
    prefetch_lines(v_, next_, end);
    next_ = end;
  }
  const void* k_;
  const void* v_;
  int64_t lines_, per_step_, next_ = 0;
};

// One query head's running maximum and total after a block whose exps
// (against `maximum`, at least the running one) sum to `block_total`: the
// factor the head's accumulator takes, 1 where the maximum stood (what came
// before counts less once a block raises it).
inline float fold_block(float& running_max, float& running_total, float maximum, float block_total) {
  float rescale = 1.f;
  if (maximum > running_max) {
    rescale = exp_nonpositive(running_max - maximum);
    running_max = maximum;
  }
  running_total = running_total * rescale + block_total;
  return rescale;
}

// How far an item's block lists reach: its own blocks, then the first
// PREFETCH_BLOCKS of the item its thread takes next, fetched during its last
// blocks so that the next item starts on blocks already on their way (each
// item used to begin on a burst it then waited for). `warm`: this item's
// first blocks were fetched so. On the AMX machine (as below): 64 x 200
// tokens 29.3 -> 28.1 ms, 64 x 32 4.2 -> 3.4, 16 x 460 15.7 -> 15.2; the ymm
// build there 64 x 200 34 -> 29.3 with the finer fetch above.
struct Stream {
  int64_t known_blocks;
  bool warm;

  // the first PREFETCH_BLOCKS of the stream at once (an item's own are on
  // their way already when it is warm); the rest come one per block (ahead)
  template <typename T>
  void start(const T* const* k_blocks, const T* const* v_blocks, int64_t num_blocks, int64_t block_bytes) const {
    const int64_t first = warm ? std::min<int64_t>(PREFETCH_BLOCKS, num_blocks) : 0;
    for (int64_t b = first; b < std::min<int64_t>(PREFETCH_BLOCKS, known_blocks); ++b)
      BlockPrefetch(k_blocks[b], v_blocks[b], block_bytes, 0).finish();
  }
  // while block b is read: the block PREFETCH_BLOCKS after it, in `steps` steps
  template <typename T>
  BlockPrefetch ahead(const T* const* k_blocks, const T* const* v_blocks, int64_t b, int64_t block_bytes,
                      int64_t steps) const {
    const bool any = b + PREFETCH_BLOCKS < known_blocks;
    return BlockPrefetch(any ? k_blocks[b + PREFETCH_BLOCKS] : nullptr, any ? v_blocks[b + PREFETCH_BLOCKS] : nullptr,
                         block_bytes, steps);
  }
};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PLD_HAVE_AVX2 1

// four 8-wide partial sums → their four totals
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// HD a multiple of 8 (64, 128). One pass over the context, block by block
// (online softmax): each K/V block is read from memory once, while it is in
// L1 for every query head of the group, and the stream of blocks the
// prefetcher keeps in flight never pauses for a softmax or a second pass
// (two passes left memory idle between them: ~27 against ~35 GB/s for the
// same blocks read alone). Scores: one query head's vector stays in
// registers while the block's K rows stream past, four rows at a time,
// their dot products reduced together; the head's accumulator is rescaled
// when the block raises its running maximum. Like every attend_*, it starts
// from maxima at -inf and totals and acc at 0 (the caller's).
template <int HD, typename T>
void attend_avx2(const float* q, int64_t group, const T* const* k_blocks, const T* const* v_blocks,
                 int64_t ctx, int64_t block_size, const Stream& stream, float* scores, float* maxima, float* totals,
                 float* acc) {
  constexpr int V = HD / 8;
  const int64_t num_blocks = (ctx + block_size - 1) / block_size;
  const int64_t block_bytes = block_size * HD * sizeof(T);
  stream.start(k_blocks, v_blocks, num_blocks, block_bytes);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const T* k = k_blocks[b];
    const T* v = v_blocks[b];
    const int64_t n = std::min(block_size, ctx - b * block_size);
    const int64_t padded = (n + 7) / 8 * 8;
    // one step at every four scored rows and at every row of values
    BlockPrefetch fetch = stream.ahead(k_blocks, v_blocks, b, block_bytes, group * (n / 4 + n));
    for (int64_t g = 0; g < group; ++g) {
      __m256 qr[V];
      for (int j = 0; j < V; ++j) qr[j] = _mm256_loadu_ps(q + g * HD + j * 8);
      __m128 block_max = _mm_set1_ps(-INFINITY);
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {
        fetch.step();
        const T* k0 = k + t * HD;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < V; ++j) {
          a0 = _mm256_fmadd_ps(qr[j], load8(k0 + j * 8), a0);
          a1 = _mm256_fmadd_ps(qr[j], load8(k0 + HD + j * 8), a1);
          a2 = _mm256_fmadd_ps(qr[j], load8(k0 + 2 * HD + j * 8), a2);
          a3 = _mm256_fmadd_ps(qr[j], load8(k0 + 3 * HD + j * 8), a3);
        }
        const __m128 dots = reduce4(a0, a1, a2, a3);
        _mm_storeu_ps(scores + t, dots);
        block_max = _mm_max_ps(block_max, dots);
      }
      for (; t < n; ++t) {
        const T* kt = k + t * HD;
        __m256 a0 = _mm256_setzero_ps();
        for (int j = 0; j < V; ++j) a0 = _mm256_fmadd_ps(qr[j], load8(kt + j * 8), a0);
        const __m128 dot = reduce4(a0, a0, a0, a0);   // every lane holds the total
        _mm_store_ss(scores + t, dot);
        block_max = _mm_max_ps(block_max, dot);
      }
      for (; t < padded; ++t) scores[t] = -INFINITY;   // exp() of the padding: ~0, and never used
      float lanes[4];
      _mm_storeu_ps(lanes, block_max);
      const float maximum =
          std::max(maxima[g], std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3])));
      const __m256 shift = _mm256_set1_ps(maximum);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t i = 0; i < padded; i += 8) {
        const __m256 p = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + i), shift));
        _mm256_storeu_ps(scores + i, p);
        sum = _mm256_add_ps(sum, p);
      }
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
      const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
      const float block_total = _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
      float* ag = acc + g * HD;
      const __m256 r = _mm256_set1_ps(fold_block(maxima[g], totals[g], maximum, block_total));
      __m256 a[V];
      for (int j = 0; j < V; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(ag + j * 8), r);
      for (int64_t u = 0; u < n; ++u) {
        fetch.step();
        const __m256 p = _mm256_set1_ps(scores[u]);
        for (int j = 0; j < V; ++j) a[j] = _mm256_fmadd_ps(p, load8(v + u * HD + j * 8), a[j]);
      }
      for (int j = 0; j < V; ++j) _mm256_storeu_ps(ag + j * 8, a[j]);
    }
    fetch.finish();
  }
}
#endif

#if defined(PLD_HAVE_AVX2) && defined(__AVX512F__)
#define PLD_HAVE_AVX512 1
#include "paged_decode_attention_zmm.h"
#endif

// any head_dim: plain loops (vectorized by the compiler where it can)
template <typename T>
void attend_scalar(const float* q, int64_t group, int64_t head_dim, const T* const* k_blocks,
                   const T* const* v_blocks, int64_t ctx, int64_t block_size, float* rows, float* maxima,
                   float* totals, float* acc) {
  const int64_t num_blocks = (ctx + block_size - 1) / block_size;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t n = std::min(block_size, ctx - b * block_size);
    for (int64_t t = 0; t < n; ++t) {
      const T* kt = k_blocks[b] + t * head_dim;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + g * head_dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < head_dim; ++i) dot += qg[i] * to_float(kt[i]);
        rows[g * ctx + b * block_size + t] = dot;
        maxima[g] = std::max(maxima[g], dot);
      }
    }
  }
  softmax_rows(rows, group, ctx, maxima, totals);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t n = std::min(block_size, ctx - b * block_size);
    for (int64_t t = 0; t < n; ++t) {
      const T* vt = v_blocks[b] + t * head_dim;
      for (int64_t g = 0; g < group; ++g) {
        const float p = rows[g * ctx + b * block_size + t];
        float* ag = acc + g * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < head_dim; ++i) ag[i] += p * to_float(vt[i]);
      }
    }
  }
}

// HD > 0: head_dim (a multiple of 8) fixed at compile time; HD == 0: any head_dim
template <int HD, typename T>
void decode_attention(T* out, int64_t out_seq_stride, const T* query, int64_t q_seq_stride,
                      const T* key_cache, const T* value_cache, const int32_t* block_tables,
                      int64_t table_width, const int64_t* table_rows, const int64_t* context_lens,
                      int64_t num_seqs, int64_t num_heads,
                      int64_t kv_heads, int64_t head_dim_runtime, int64_t num_blocks, int64_t block_size,
                      float scale, int num_threads) {
  const int64_t head_dim = HD > 0 ? HD : head_dim_runtime;
  const int64_t group = num_heads / kv_heads;
  const int64_t block_stride = block_size * head_dim;
  const int64_t work = num_seqs * kv_heads;
#ifdef PLD_HAVE_AVX2
  constexpr bool one_pass = HD > 0;   // attend_avx2 / attend_avx512: a block of scores at a time
#else
  constexpr bool one_pass = false;    // attend_scalar for every head_dim: [group, ctx] scores
#endif

  // (sequence, KV head) items handed out one at a time, to the first thread
  // free: contexts differ in length, so equal shares of items are not equal
  // shares of work. A thread claims its next item before it starts one, so
  // that it can fetch the next one's first blocks meanwhile.
  std::atomic<int64_t> next_item{0};
  // the K and V of item `it`'s first `count` blocks into k[0..count), v[0..count)
  auto item_blocks = [&](int64_t it, int64_t count, const T** k, const T** v) {
    const int64_t s = it / kv_heads, h = it % kv_heads;
    const int32_t* table = block_tables + (table_rows != nullptr ? table_rows[s] : s) * table_width;
    const T* k_head = key_cache + h * num_blocks * block_stride;
    const T* v_head = value_cache + h * num_blocks * block_stride;
    for (int64_t b = 0; b < count; ++b) {
      k[b] = k_head + static_cast<int64_t>(table[b]) * block_stride;
      v[b] = v_head + static_cast<int64_t>(table[b]) * block_stride;
    }
  };
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> q_buf(group * head_dim), acc_buf(group * head_dim), scores;
    std::vector<float> maxima(group), totals(group);
    std::vector<const T*> k_blocks(table_width + PREFETCH_BLOCKS), v_blocks(table_width + PREFETCH_BLOCKS);
    float* q = q_buf.data();
    float* acc = acc_buf.data();
    bool warm = false;
    for (int64_t item = next_item.fetch_add(1, std::memory_order_relaxed); item < work;) {
      const int64_t following = next_item.fetch_add(1, std::memory_order_relaxed);
      const int64_t s = item / kv_heads, h = item % kv_heads;
      const int64_t ctx = context_lens[s];
      const int64_t used_blocks = (ctx + block_size - 1) / block_size;
      scores.resize(one_pass ? block_size + 8 : group * ctx);
      float* rows = scores.data();
      for (int64_t g = 0; g < group; ++g) {
        const T* src = query + s * q_seq_stride + (h * group + g) * head_dim;
        for (int64_t i = 0; i < head_dim; ++i) q[g * head_dim + i] = to_float(src[i]) * scale;
        maxima[g] = -INFINITY;
        totals[g] = 0.f;
      }
      std::fill(acc, acc + group * head_dim, 0.f);
      item_blocks(item, used_blocks, k_blocks.data(), v_blocks.data());
      int64_t known = used_blocks;
      if (following < work) {
        const int64_t next_blocks = (context_lens[following / kv_heads] + block_size - 1) / block_size;
        const int64_t ahead = std::min<int64_t>(PREFETCH_BLOCKS, next_blocks);
        item_blocks(following, ahead, k_blocks.data() + known, v_blocks.data() + known);
        known += ahead;
      }
      const Stream stream{known, warm};
#ifdef PLD_HAVE_AVX512
      if constexpr (HD > 0 && HD % 16 == 0 && std::is_same_v<T, float>) {
        attend_avx512<HD>(q, group, k_blocks.data(), v_blocks.data(), ctx, block_size, stream, maxima.data(),
                          totals.data(), acc);
      } else
#endif
#ifdef PLD_HAVE_AVX2
      if constexpr (HD > 0) {
        attend_avx2<HD, T>(q, group, k_blocks.data(), v_blocks.data(), ctx, block_size, stream, rows,
                           maxima.data(), totals.data(), acc);
      } else
#endif
      {
        attend_scalar<T>(q, group, head_dim, k_blocks.data(), v_blocks.data(), ctx, block_size, rows,
                         maxima.data(), totals.data(), acc);
      }
      for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.f / totals[g];
        T* dst = out + s * out_seq_stride + (h * group + g) * head_dim;
        for (int64_t i = 0; i < head_dim; ++i) dst[i] = from_float<T>(acc[g * head_dim + i] * inv);
      }
      warm = one_pass && known > used_blocks;   // the plain loops fetch nothing ahead
      item = following;
    }
  }
}

template <typename T>
void dispatch(void* out, int64_t out_seq_stride, const void* query, int64_t q_seq_stride, const void* key_cache,
              const void* value_cache, const int32_t* block_tables, int64_t table_width,
              const int64_t* table_rows, const int64_t* context_lens, int64_t num_seqs, int64_t num_heads,
              int64_t kv_heads, int64_t head_dim,
              int64_t num_blocks, int64_t block_size, float scale, int num_threads) {
  auto run = [&](auto fn) {
    fn(static_cast<T*>(out), out_seq_stride, static_cast<const T*>(query), q_seq_stride,
       static_cast<const T*>(key_cache), static_cast<const T*>(value_cache), block_tables, table_width,
       table_rows, context_lens, num_seqs, num_heads, kv_heads, head_dim, num_blocks, block_size, scale, num_threads);
  };
  if (head_dim == 64) run(decode_attention<64, T>);
  else if (head_dim == 128) run(decode_attention<128, T>);
  else run(decode_attention<0, T>);
}

}  // namespace

extern "C" {

// dtype: 0 float32, 1 bfloat16, 2 float16. Shapes: out [seqs, heads*head_dim]
// (row stride out_seq_stride elements), query [seqs, heads, head_dim] (row
// stride q_seq_stride), caches [kv_heads, num_blocks, block_size, head_dim]
// contiguous, block_tables [rows, table_width] int32 (sequence s uses row
// table_rows[s], or row s when table_rows is null), context_lens [seqs]
// int64. The caller checks shapes, rows and block ids.
int paged_decode_attention(int dtype, void* out, int64_t out_seq_stride, const void* query, int64_t q_seq_stride,
                           const void* key_cache, const void* value_cache, const int32_t* block_tables,
                           int64_t table_width, const int64_t* table_rows, const int64_t* context_lens,
                      int64_t num_seqs, int64_t num_heads,
                           int64_t kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, float scale,
                           int num_threads) {
  switch (dtype) {
    case 0: dispatch<float>(out, out_seq_stride, query, q_seq_stride, key_cache, value_cache, block_tables,
                            table_width, table_rows, context_lens, num_seqs, num_heads, kv_heads, head_dim, num_blocks,
                            block_size, scale, num_threads); return 0;
    case 1: dispatch<bf16>(out, out_seq_stride, query, q_seq_stride, key_cache, value_cache, block_tables,
                           table_width, table_rows, context_lens, num_seqs, num_heads, kv_heads, head_dim, num_blocks,
                           block_size, scale, num_threads); return 0;
    case 2: dispatch<_Float16>(out, out_seq_stride, query, q_seq_stride, key_cache, value_cache, block_tables,
                               table_width, table_rows, context_lens, num_seqs, num_heads, kv_heads, head_dim, num_blocks,
                               block_size, scale, num_threads); return 0;
    default: return 1;
  }
}

}

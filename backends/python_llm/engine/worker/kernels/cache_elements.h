// The K/V cache's element types as the attention kernels read and write
// them: fp32, bf16 (its upper 16 bits; rounded to nearest even on the way
// back, as PyTorch does) and fp16. Both attention kernels include it, so a
// cache dtype is converted one way everywhere.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

struct bf16 { uint16_t bits; };

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x.bits) << 16); }
inline float to_float(_Float16 x) { return static_cast<float>(x); }

template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline _Float16 from_float<_Float16>(float x) { return static_cast<_Float16>(x); }
template <> inline bf16 from_float<bf16>(float x) {
  uint32_t u = __builtin_bit_cast(uint32_t, x);
  if (std::isnan(x)) return bf16{0x7fc0};
  u += 0x7fff + ((u >> 16) & 1);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// eight cache elements as fp32 lanes
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline __m256 load8(const _Float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

}  // namespace

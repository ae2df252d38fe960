/* A draft's product of a few rows with 4-bit weights (W4A8) and AVX2: half the bytes of the int8
 * GEMV (int8_gemv.c), for a one-row step that is bound by reading its weights. int4_gemv.py says
 * where it is used: a drafter's steps, whose rounding decides only which tokens it proposes.
 *
 * Weights: per group of 64 input channels, w = scale * u + minimum with u in [0, 15], stored as
 * nibbles. Rows: int8 in [-127, 127] by each row's absolute maximum. A group's sum(w * x) is
 * scale * sum(u * x) + minimum * sum(x): the first exact in int32 (uint8 x int8 pairs are at most
 * 2 * 15 * 127, so a group's two halves summed in int16 stay inside it), the second added once per
 * channel from the row's group sums. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int4_gemv.h"

#define ROWS_PER_PASS 4
#define CHANNELS_PER_BLOCK 16
/* how far ahead in the packed weights to prefetch: on a Xeon (family 6, model 167, AVX2 code) 2048
 * bytes ran 1.17-1.36x 512 on the pair's shapes at 1-4 rows, 3072 no faster */
#define PREFETCH_BYTES 2048

static void quantize_row(const float* x, int64_t kx, int64_t k, int8_t* q, float* sums, float* scale_out) {
  float peak = 0.f;
  for (int64_t i = 0; i < kx; ++i) {
    const float a = fabsf(x[i]);
    peak = a > peak || a != a ? a : peak;
  }
  if (peak != peak) { /* a NaN row: its outputs NaN, as torch's products would give */
    memset(q, 0, (size_t)k);
    memset(sums, 0, (size_t)(k / W4A8_GROUP) * sizeof(float));
    *scale_out = peak;
    return;
  }
  const float scale = peak > 1e-30f ? peak / 127.f : 1e-30f / 127.f;
  const float inverse = 1.f / scale;
  for (int64_t i = 0; i < kx; ++i) q[i] = (int8_t)nearbyintf(x[i] * inverse);
  memset(q + kx, 0, (size_t)(k - kx));
  for (int64_t g = 0; g < k / W4A8_GROUP; ++g) {
    int32_t sum = 0;
    for (int64_t i = 0; i < W4A8_GROUP; ++i) sum += q[g * W4A8_GROUP + i];
    sums[g] = (float)sum; /* exact: at most 64 * 127 */
  }
  *scale_out = scale;
}

static inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* sum(a[i] * b[i]), i < n: a channel's group minima against a row's group sums. */
static inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float sum = horizontal_sum(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

/* One group of a channel against R rows (`q` at the group's first input channel, rows k apart): its
 * 32 packed bytes unpacked once, then per row two byte products, their int16 sum widened to int32
 * lanes, and one FMA by the group's scale. */
static inline __attribute__((always_inline)) void group_dots(const uint8_t* packed, const float* scale,
                                                             const int8_t* q, int64_t k, const int R, __m256* acc) {
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  _mm_prefetch((const char*)(packed + PREFETCH_BYTES), _MM_HINT_T0);
  const __m256i bytes = _mm256_loadu_si256((const __m256i*)packed);
  const __m256i low = _mm256_and_si256(bytes, low_mask);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_mask);
  const __m256 s = _mm256_broadcast_ss(scale);
  for (int r = 0; r < R; ++r) {
    const int8_t* x = q + r * k;
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_loadu_si256((const __m256i*)x)),
                                           _mm256_maddubs_epi16(high, _mm256_loadu_si256((const __m256i*)(x + 32))));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))), s, acc[r]);
  }
}

/* One channel against R rows, its packed weights read once and in order; even and odd groups
 * accumulate apart (two FMA chains in flight), and the minima's share comes at the end. */
static inline __attribute__((always_inline)) void channel_dots(const uint8_t* packed, const float* scales,
                                                               const float* minima, int64_t groups, const int8_t* q,
                                                               int64_t k, const float* sums, const int R, float* dots) {
  __m256 even[ROWS_PER_PASS], odd[ROWS_PER_PASS];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    group_dots(packed + g * 32, scales + g, q + g * W4A8_GROUP, k, R, even);
    group_dots(packed + (g + 1) * 32, scales + g + 1, q + (g + 1) * W4A8_GROUP, k, R, odd);
  }
  if (g < groups) group_dots(packed + g * 32, scales + g, q + g * W4A8_GROUP, k, R, even);
  for (int r = 0; r < R; ++r)
    dots[r] = horizontal_sum(_mm256_add_ps(even[r], odd[r])) + dot(minima, sums + r * groups, groups);
}

static void channel_block(const w4a8_weight* w, const int8_t* q, const float* sums, const float* row_scales,
                          int64_t rows, int64_t n0, float* out, int64_t ldo) {
  const int64_t groups = w->k / W4A8_GROUP;
  const int64_t n1 = w->n < n0 + CHANNELS_PER_BLOCK ? w->n : n0 + CHANNELS_PER_BLOCK;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* packed = w->packed + n * (w->k / 2);
    const float* scales = w->scales + n * groups;
    const float* minima = w->minima + n * groups;
    for (int64_t m0 = 0; m0 < rows; m0 += ROWS_PER_PASS) {
      const int8_t* qm = q + m0 * w->k;
      const float* sm = sums + m0 * groups;
      const int64_t pass_rows = rows - m0 < ROWS_PER_PASS ? rows - m0 : ROWS_PER_PASS;
      float dots[ROWS_PER_PASS];
      switch (pass_rows) {
        case 1: channel_dots(packed, scales, minima, groups, qm, w->k, sm, 1, dots); break;
        case 2: channel_dots(packed, scales, minima, groups, qm, w->k, sm, 2, dots); break;
        case 3: channel_dots(packed, scales, minima, groups, qm, w->k, sm, 3, dots); break;
        default: channel_dots(packed, scales, minima, groups, qm, w->k, sm, 4, dots); break;
      }
      for (int64_t r = 0; r < pass_rows; ++r) out[(m0 + r) * ldo + n] = dots[r] * row_scales[m0 + r];
    }
  }
}

int w4a8_gemm(const w4a8_weight* w, const float* x, int64_t kx, int64_t ldx, int64_t rows, float* out, int64_t ldo,
              int threads) {
  if (rows < 1 || rows > W4A8_MAX_ROWS || kx > w->k || w->k % W4A8_GROUP) return -1;
  const int64_t groups = w->k / W4A8_GROUP;
  int8_t* q = (int8_t*)malloc((size_t)(rows * w->k));
  float* sums = (float*)malloc((size_t)(rows * groups) * sizeof(float));
  if (q == NULL || sums == NULL) {
    free(q);
    free(sums);
    return -1;
  }
  float row_scales[W4A8_MAX_ROWS];
  for (int64_t m = 0; m < rows; ++m) quantize_row(x + m * ldx, kx, w->k, q + m * w->k, sums + m * groups, row_scales + m);
  const int64_t blocks = (w->n + CHANNELS_PER_BLOCK - 1) / CHANNELS_PER_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b)
    channel_block(w, q, sums, row_scales, rows, b * CHANNELS_PER_BLOCK, out, ldo);
  free(q);
  free(sums);
  return 0;
}

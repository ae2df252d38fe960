/* The W8A8 product of a few rows (a decode step, a verify block) with AVX2, bitwise what fbgemm's
 * dynamic GEMM computes for `quantize._RowQuantGemm`: see int8_gemv.py for the contract.
 *
 * Each row is divided by its absolute maximum and quantised to uint8 as torch's fbgemm does
 * (x * inverse scale + zero point in one FMA, rounded to nearest even, clamped); the
 * integer dot products with the int8 weights are exact whatever their order; the epilogue is
 * fbgemm's for per-channel weights: float(acc - zp * colsum[n]) * (act_scale * w_scale[n]), then
 * times the row's maximum, each a single float multiplication. Built with -ffp-contract=off so
 * that no other multiplication is fused into an FMA.
 *
 * The weights are read once per call whatever the row count, in memory order: each thread streams
 * its own run of output channels, one channel at a time against every row. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int8_gemv.h"

#define ROWS_PER_PASS 4       /* rows per pass over a channel's weights: 8 accumulators of 16 registers */
#define CHANNELS_PER_BLOCK 16 /* channels per parallel work item */
#define PREFETCH_BYTES 1024   /* how far ahead in a weight row to prefetch (measured: 0.95-1.1x of none) */

static void quantize_row(const float* x, int64_t k, int64_t padded, float inverse_scale, int32_t zero_point,
                         uint8_t* q, float* peak_out) {
  float peak = 0.f;
  int has_nan = 0;
  for (int64_t i = 0; i < k; ++i) {
    float a = fabsf(x[i]);
    has_nan |= a != a;
    peak = a > peak ? a : peak;
  }
  if (has_nan) peak = NAN; /* as torch's amax: the row's outputs become NaN */
  else if (peak < 1e-30f) peak = 1e-30f;
  for (int64_t i = 0; i < k; ++i) {
    /* one rounding of x * inverse + zero point (an FMA), as torch's fbgemm quantises: rounding the
     * product first parts from it at about one value in 20 that lands on a half step */
    const float r = nearbyintf(fmaf(x[i] / peak, inverse_scale, (float)zero_point));
    q[i] = (uint8_t)(r < 0.f ? 0.f : r > 255.f ? 255.f : r);
  }
  memset(q + k, 0, (size_t)(padded - k)); /* meets zeroed weight bytes: adds nothing */
  *peak_out = peak;
}

static inline int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

/* Bytes [k0, k0 + 32) of a weight row, zero past k (the tail of a row that is no multiple of 32). */
static inline __m256i load_weight_tail(const int8_t* row, int64_t k0, int64_t k) {
  int8_t tail[32] = {0};
  memcpy(tail, row + k0, (size_t)(k - k0));
  return _mm256_loadu_si256((const __m256i*)tail);
}

static inline __m256i dot_step(__m256i acc, const uint8_t* x, __m256i w) {
  /* uint8 x int8 pairs: at most 2 * 128 * 127, inside int16 (the activations use 7 bits) */
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i*)x), w);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* One channel's dot products with R rows, its weight bytes read once and in order. R is a
 * constant at every call (see channel_block), so the accumulators stay in registers; two per row
 * keep two multiply chains in flight. */
static inline __attribute__((always_inline)) void channel_dots(const int8_t* w, int64_t k, const uint8_t* q,
                                                               int64_t padded, const int R, int32_t* dots) {
  __m256i even[ROWS_PER_PASS], odd[ROWS_PER_PASS];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_si256();
  int64_t k0 = 0;
  for (; k0 + 64 <= k; k0 += 64) {
    _mm_prefetch((const char*)(w + k0 + PREFETCH_BYTES), _MM_HINT_T0);
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(w + k0));
    const __m256i w1 = _mm256_loadu_si256((const __m256i*)(w + k0 + 32));
    for (int r = 0; r < R; ++r) {
      even[r] = dot_step(even[r], q + r * padded + k0, w0);
      odd[r] = dot_step(odd[r], q + r * padded + k0 + 32, w1);
    }
  }
  for (; k0 < k; k0 += 32) {
    const __m256i wv = k0 + 32 <= k ? _mm256_loadu_si256((const __m256i*)(w + k0)) : load_weight_tail(w, k0, k);
    for (int r = 0; r < R; ++r) even[r] = dot_step(even[r], q + r * padded + k0, wv);
  }
  for (int r = 0; r < R; ++r) dots[r] = horizontal_sum(_mm256_add_epi32(even[r], odd[r]));
}

static void channel_block(const w8a8_weight* w, const uint8_t* q, int64_t padded, const float* peaks, int64_t rows,
                          int64_t n0, float* out, int64_t ldo) {
  const int64_t n1 = w->n < n0 + CHANNELS_PER_BLOCK ? w->n : n0 + CHANNELS_PER_BLOCK;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* weight = w->weight + n * w->k;
    for (int64_t m0 = 0; m0 < rows; m0 += ROWS_PER_PASS) {
      const uint8_t* qm = q + m0 * padded;
      const int64_t pass_rows = rows - m0 < ROWS_PER_PASS ? rows - m0 : ROWS_PER_PASS;
      int32_t dots[ROWS_PER_PASS];
      switch (pass_rows) {
        case 1: channel_dots(weight, w->k, qm, padded, 1, dots); break;
        case 2: channel_dots(weight, w->k, qm, padded, 2, dots); break;
        case 3: channel_dots(weight, w->k, qm, padded, 3, dots); break;
        default: channel_dots(weight, w->k, qm, padded, 4, dots); break;
      }
      for (int64_t r = 0; r < pass_rows; ++r) {
        const float y = (float)(dots[r] - w->zero_point * w->colsum[n]) * w->multiplier[n];
        out[(m0 + r) * ldo + n] = y * peaks[m0 + r];
      }
    }
  }
}

int w8a8_gemm(const w8a8_weight* w, const float* x, int64_t ldx, int64_t rows, float* out, int64_t ldo,
              int threads) {
  if (rows < 1 || rows > W8A8_MAX_ROWS) return -1;
  const int64_t padded = (w->k + 31) / 32 * 32;
  uint8_t* q = (uint8_t*)malloc((size_t)(rows * padded));
  if (q == NULL) return -1;
  float peaks[W8A8_MAX_ROWS];
  for (int64_t m = 0; m < rows; ++m)
    quantize_row(x + m * ldx, w->k, padded, w->inverse_scale, w->zero_point, q + m * padded, peaks + m);
  const int64_t blocks = (w->n + CHANNELS_PER_BLOCK - 1) / CHANNELS_PER_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) channel_block(w, q, padded, peaks, rows, b * CHANNELS_PER_BLOCK, out, ldo);
  free(q);
  return 0;
}

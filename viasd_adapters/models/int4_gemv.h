/* The 4-bit GEMV's C interface (int4_gemv.c), called by native_ops.cpp. */
#ifndef VIASD_INT4_GEMV_H
#define VIASD_INT4_GEMV_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define W4A8_GROUP 64 /* input channels per weight scale */
#define W4A8_MAX_ROWS 64

typedef struct {
  const uint8_t* packed; /* [n, k / 2]: per group of 64, byte j holds u of weight j (low nibble) and of j + 32 */
  const float* scales;   /* [n, k / W4A8_GROUP]: weight = scale * u + minimum */
  const float* minima;   /* [n, k / W4A8_GROUP] */
  int64_t k, n;          /* k: a multiple of W4A8_GROUP (zero weights pad a layer's own width) */
} w4a8_weight;

/* out [rows, n] (row stride ldo) = x [rows, kx] (row stride ldx, kx <= k: the rest is zero) times
 * the weight's transpose, each row quantised to int8 by its own absolute maximum, on `threads`
 * OpenMP threads; rows <= W4A8_MAX_ROWS. Returns 0, or -1 when rows is out of range or memory ran out. */
int w4a8_gemm(const w4a8_weight* w, const float* x, int64_t kx, int64_t ldx, int64_t rows, float* out, int64_t ldo,
              int threads);

#ifdef __cplusplus
}
#endif
#endif

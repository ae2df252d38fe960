/* The int8 GEMV's C interface (int8_gemv.c), called by native_ops.cpp. */
#ifndef VIASD_INT8_GEMV_H
#define VIASD_INT8_GEMV_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const int8_t* weight;    /* [n, k], row-major */
  const int32_t* colsum;   /* [n]: each channel's weight sum */
  const float* multiplier; /* [n]: act_scale * w_scale[n] in float */
  int64_t k, n;
  float inverse_scale;     /* 1.f / act_scale */
  int32_t zero_point;
} w8a8_weight;

#define W8A8_MAX_ROWS 64

/* out [rows, n] (row stride ldo) = the W8A8 product of x [rows, k] (row stride ldx) with the
 * weight, on `threads` OpenMP threads; rows <= W8A8_MAX_ROWS. Returns 0, or -1 when rows is out
 * of range or memory ran out. */
int w8a8_gemm(const w8a8_weight* w, const float* x, int64_t ldx, int64_t rows, float* out, int64_t ldo, int threads);

#ifdef __cplusplus
}
#endif
#endif

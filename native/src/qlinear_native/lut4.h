/* Shared pieces of qlinear's native 4-bit look-up-table weight kernels (bitsandbytes NF4 / FP4; lut4_mv.c,
 * lut4_mm.c, _lut4.c).
 *
 * y[M, N] = x[M, K] @ W^T with W[n, k] = table[c(n, k)] * absmax[n, k / block], W never materialized:
 *   codes uint8 [N, K/2]: byte j of row n holds c(n, 2j) in its HIGH nibble and c(n, 2j + 1) in its LOW one
 *     (bitsandbytes' order), absmax float32 [N, K/block], table float32 [16] (NF4, FP4 or any other);
 *   x bfloat16 or float32 [M, ldx]; y the same dtype [M, ldo] (bfloat16: rounded once, to nearest even).
 * Every weight is the float32 product fl(table[c] * absmax) (the kernels multiply the table by each block's
 * absmax, in float32, and look the codes up in the product), exactly the float32 weight that bitsandbytes'
 * dequantization computes before casting. The AVX-512 kernel forms each product x * w as a float32 FMA; the AMX
 * kernel splits w exactly into three bfloat16 terms (w = hi + mid + lo, see lut4_mm.c) whose products with a
 * bfloat16 x are exact. Sums are float32, per output in a fixed order that does not depend on the thread count.
 * Requirements (checked by _lut4.c): block % 32 == 0, K % block == 0, any N >= 1, ldx >= K, ldo >= N, no
 * alignment. Output channels are split over `threads` OpenMP threads.
 */
#ifndef QLINEAR_LUT4_H
#define QLINEAR_LUT4_H
#include "cpu_common.h"

/* One call's arguments. */
typedef struct {
    const void *x; /* bfloat16 (uint16_t) or float32, [M, ldx] */
    const uint8_t *codes;
    const float *absmax;
    const float *table;
    void *out; /* x's dtype, [M, ldo] */
    int64_t m, k, n, block, ldx, ldo;
    int x_f32, threads;
} q4_call;

/* Store y into out[i, j] in x's dtype. */
static inline void q4_put(const q4_call *c, int64_t i, int64_t j, float y) {
    if (c->x_f32)
        ((float *)c->out)[i * c->ldo + j] = y;
    else
        ((uint16_t *)c->out)[i * c->ldo + j] = ql_bf16(y);
}

/* 1 when this CPU and OS run the kernels; 0 elsewhere, including non-x86 builds. */
int q4_mv_ready(void);
int q4_amx_ready(void);
#if QL_X86
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* AVX-512 float32 kernel, any M (lut4_mv.c); AMX-BF16 kernel, bfloat16 x (lut4_mm.c). 0, or -1 when out of
 * memory. */
int q4_mv(const q4_call *c);
int q4_mm(const q4_call *c);
#endif
#endif

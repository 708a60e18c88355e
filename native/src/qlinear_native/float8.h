/* Shared pieces of qlinear's native float-quantized weight kernels (float8_mv.c, float8_amx.c, _float.c).
 *
 * y[M, N] = x[M, K] @ W^T, x bfloat16 (row pitch ldx), y float32 or bfloat16 (row pitch ldo), W never
 * materialized:
 *   FP8: w8 uint8 [N, K] raw float8 bytes (e4m3fn: 1-4-3, bias 7, max 448, 0x7F/0xFF NaN, no inf; e5m2: 1-5-2,
 *        bias 15, inf and NaN), scale float32 [N, ceil(K/bk)]: W[n, k] = fp8(w8[n, k]) * scale[n, k / bk].
 *   FP4: packed uint8 [N, K/2] (column 2j in byte j's low nibble, 2j+1 in its high nibble), each nibble E2M1
 *        (bit 3 sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6); block scales uint8 [N, K/bs]: NVFP4 bs = 16,
 *        float8 e4m3fn bytes; MXFP4 bs = 32, E8M0 bytes (2**(e - 127), 255 = NaN); y = g * sum_k x W.
 * Every product is exact: each e4m3/e5m2 value, subnormals included, is a normal bfloat16 (the decode tables
 * hold those bfloat16 values, so no instruction ever sees a denormal weight, whatever MXCSR.DAZ says), and an
 * E2M1 code times an e4m3 or in-range power-of-two scale is a normal bfloat16 too. Products are formed in
 * float32 (8-bit by 8-bit significands: exact) or by AMX TDPBF16PS (exact products), and summed in float32.
 * Output channels are split over `threads` OpenMP threads; each output is summed by one thread in a fixed
 * order, so results do not depend on the thread count.
 * Requirements (checked by _float.c): K % 32 == 0 (every format; bk = K with K % 32 != 0 is refused), bk % 32 ==
 * 0 or bk >= K (one block; the last block may be partial: ceil(K/bk) scales), any N >= 1, ldx >= K, ldo >= N,
 * no alignment. Edge cases: bfloat16 activations below 2**-126 (denormals) are used by the AVX-512 kernels and
 * read as zero by the AMX ones; an E8M0 scale of 0 (2**-127) is a float32 denormal in the AVX-512 kernels, so it
 * reads as zero if the caller set MXCSR.DAZ (torch.set_flush_denormal(True)).
 */
#ifndef QLINEAR_FLOAT8_H
#define QLINEAR_FLOAT8_H
#include "cpu_common.h"

typedef enum { QF_E4M3 = 0, QF_E5M2 = 1 } qf_fp8;
typedef enum { QF_NVFP4 = 0, QF_MXFP4 = 1 } qf_fp4;

/* One call's arguments. fp8: w = w8, scale = float32 [N, ceil(K/bk)], blk = bk. fp4: w = packed, scale = the
 * block-scale bytes [N, K/bs], blk = bs (16 or 32), g the global multiplier. */
typedef struct {
    const uint16_t *x;
    const uint8_t *w;
    const void *scale;
    void *out;
    int64_t ldx, ldo, m, k, n, blk;
    int fmt, out_bf16, threads;
    float g;
} qf_call;

/* Store y into out[i, j] (float32 or bfloat16 by c->out_bf16). */
static inline void qf_put(const qf_call *c, int64_t i, int64_t j, float y) {
    if (c->out_bf16)
        ((uint16_t *)c->out)[i * c->ldo + j] = ql_bf16(y);
    else
        ((float *)c->out)[i * c->ldo + j] = y;
}

/* Decode tables, filled once by qf_init() (module init) from the format definitions:
 * qf_fp8_lo/hi[f][c]: low and high byte of the bfloat16 value of float8 magnitude c (0..127) of format f (every
 * value, subnormals included, is a normal bfloat16; e4m3fn 127 and e5m2 NaN codes give NaN, e5m2 124 inf);
 * qf_e2m1[q]: float32 value of E2M1 code q; qf_nv_tab/qf_mx_tab[s][q]: bfloat16 of code q times scale byte s
 * (exact for every NVFP4 scale; for MXFP4 when 2 <= s <= 252, see qf_mx_exact). */
extern uint8_t qf_fp8_lo[2][128], qf_fp8_hi[2][128];
extern float qf_e2m1[16];
extern uint16_t qf_nv_tab[256][16], qf_mx_tab[256][16];
void qf_init(void);
/* E8M0 bytes whose table row is exact: every E2M1 magnitude times 2**(s - 127) a normal, finite bfloat16. */
static inline int qf_mx_exact(unsigned s) { return s >= 2 && s <= 252; }

/* VPERMT2B indices (ib[0], ib[1]) that interleave a vector of low bytes and one of high bytes (index 64 + i) into
 * bfloat16 words in column order: words 0..31, then 32..63. */
static inline void qf_column_order(uint8_t ib[2][64]) {
    for (int j = 0; j < 32; j++) {
        ib[0][2 * j] = (uint8_t)j;
        ib[0][2 * j + 1] = (uint8_t)(64 + j);
        ib[1][2 * j] = (uint8_t)(32 + j);
        ib[1][2 * j + 1] = (uint8_t)(96 + j);
    }
}

int qf_mv_ready(void);
int qf_amx_ready(void);
#if QL_X86
#define QF_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma")))

/* AVX-512 kernels, any M (float8_mv.c); 0, or -1 when out of memory. The _range forms compute output
 * channels [n_lo, n_hi) on the calling thread only. */
int qf_fp8_mv(const qf_call *c);
int qf_fp4_mv(const qf_call *c);
int qf_fp4_mv_range(const qf_call *c, int64_t n_lo, int64_t n_hi);
/* AMX-BF16 kernels (float8_amx.c). */
int qf_fp8_amx(const qf_call *c);
int qf_fp4_amx(const qf_call *c);
#endif
#endif

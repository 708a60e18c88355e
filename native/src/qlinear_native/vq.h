/* qlinear_native._vq: VPTQ codes times activations (vq_mv) and bfloat16 weight tiles (vq_decode); the layout and
 * arithmetic are described in vq.c, the Python bindings in _vq.c. */
#ifndef QLINEAR_VQ_H
#define QLINEAR_VQ_H
#include <stdint.h>

#define VQ_MAX_M 8
/* rows one call takes for V == 8 and 16-bit codebooks where AVX-512 holds two vectors a register (vq_max_rows) */
#define VQ_MAX_M_PAIRS 16
#define VQ_MAX_V 32

enum { VQ_F16 = 0, VQ_BF16 = 1, VQ_F32 = 2 };

/* One call: indices [G][J][W] int32 bit streams, codebooks [G][C*V] (and [G][R*V]) of dtype dt, x float32 [M][ldx]
 * (and, where vq_columns says so, the same values column-major in xt [Kmain][M]), y float32 [M][ldy]. */
typedef struct {
    const uint32_t *idx;
    const void *cb, *rcb;
    const float *x, *xt;
    float *y;
    int64_t m, g, j, w, gs, kmain, ldx, ldy;
    int v, cbits, rbits, dt, threads;
} vq_call;

/* Whether vq_run reads x column-major (c->xt) for this call: the AVX2 kernels for 3 rows and more */
int vq_columns(const vq_call *c);
/* The most rows one vq_run call takes for this vector length and codebook dtype (c->v, c->dt) */
int vq_max_rows(const vq_call *c);
/* y = x times the main weight (M <= vq_max_rows), threads over vectors */
void vq_run(const vq_call *c);
/* vectors j0..j1-1 of the main weight into out [Kmain][ldo] bfloat16 (transposed) */
void vq_decode_cols(const vq_call *c, int64_t j0, int64_t j1, uint16_t *out, int64_t ldo);
#endif

/* qlinear_native._exl3: EXL3 trellis tiles decoded to float32 (exl3_decode_tiles) and multiplied with up to
 * EXL3_MV_ROWS activation rows without leaving registers (exl3_mv); layout and arithmetic in exl3.c, the Python
 * bindings in _exl3.c. */
#ifndef QLINEAR_EXL3_H
#define QLINEAR_EXL3_H
#include <stdint.h>

/* activation rows one pass of exl3_mv multiplies (more rows take more passes, each decoding the tiles again) */
#define EXL3_MV_ROWS 16

/* Per tile element (row-major r * 16 + c): the two word indices of its 16-bit state and the right shift; and
 * the same per tile row as vectors (word index pairs, shifts) for the AVX-512 decode. */
/* How a state becomes its value: a lookup in the float32 table, or the codebook's own arithmetic (AVX-512 only). */
typedef enum { EXL3_TABLE = 0, EXL3_3INST, EXL3_MCG, EXL3_MUL1 } exl3_codebook;

typedef struct {
    int bits, nw; /* trellis bits; 16-bit words per tile (16 bits) */
    exl3_codebook cb;
    uint16_t w0[256], w1[256];
    uint8_t shift[256];
    uint16_t idx[16][32] __attribute__((aligned(64))); /* lane 2c: w1 of (r, c), lane 2c + 1: w0 */
    uint32_t sh[16][16] __attribute__((aligned(64)));
} exl3_plan;

void exl3_make_plan(int bits, exl3_codebook cb, exl3_plan *p);
/* tiles nt0..nt1-1 of every tile row into out[kt * 16 + r][(nt - nt0) * 16 + c] (row stride ldo) */
void exl3_decode_tiles(const uint16_t *trellis, const float *table, float *out, int64_t kt_n, int64_t nt_n,
                       int64_t nt0, int64_t nt1, int64_t ldo, int threads, const exl3_plan *p);
/* y [M][16 NT] = x [M][16 KT] times the inner weight (float32 sums; threads over column tiles) */
void exl3_mv(const uint16_t *trellis, const float *table, const float *x, float *y, int64_t m, int64_t kt_n,
             int64_t nt_n, int threads, const exl3_plan *p);
#endif

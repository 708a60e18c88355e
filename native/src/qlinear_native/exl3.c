/* EXL3 trellis tiles on a CPU: decoded to float32, or multiplied with activation rows as they are decoded.
 *
 * Layout (qlinear's layouts/exl3.py): trellis int16 [KT][NT][16 * bits] holds one 16x16 tile per (kt, nt) as a
 * cyclic bit stream read in 16-bit words with each pair swapped (word j ^ 1). The 16-bit state of stream position t
 * is the 16 stream bits ending with symbol t: bits [start, start + 16) with start = (t * bits + bits - 16) mod
 * (16 * 16 * bits); position t sits at tile row 2 (lane % 4) + (item % 2) + 8 ((item / 2) % 2), column lane / 4 +
 * 8 (item / 4), lane = t / 8, item = t % 8 (the tensor-core fragment order). The value of a state is table[state]
 * (the caller's float32 copy of the float16 codebook table: exact).
 *
 * With AVX-512 (BW) a tile row's 16 states come from the tile's words held in up to four registers: one two-source
 * word permute puts each element's word pair side by side as a 32-bit lane (VPERMT2W, a second one and a blend for
 * tiles of more than 64 words), one variable shift and a mask give the states, one gather their values. exl3_mv
 * then adds value x x[row] into float32 sums kept in registers for the tile column (16 output channels) across all
 * of K: every weight is decoded once per pass of up to EXL3_MV_ROWS rows and never stored.
 *
 * The gather is the slow step (a 256 KB table, one L1 miss per value), so for the three codebooks the values are
 * computed as exllamav3's decode_3inst computes them, exactly (the same numbers as the table, tested): 3inst / mcg
 * multiply the state (plus a constant for 3inst), keep bits 0x8FFF8FFF, flip 0x3B603B60 and add the two float16
 * halves with one rounding to float16;
 * mul1 multiplies, sums the product's four bytes (VPDPBUSD with ones; AVX512-VNNI) and takes
 * (1024 + sum) k_inv + k_bias, rounded once to float16.
 */
#include "exl3.h"

#include <string.h>

#include "cpu_common.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define EXL3_AVX512 1
#else
#define EXL3_AVX512 0
#endif

void exl3_make_plan(int bits, exl3_codebook cb, exl3_plan *p) {
    const int64_t nw = 16 * (int64_t)bits, len = nw * 16;
    p->bits = bits;
    p->cb = cb;
    p->nw = (int)nw;
    for (int t = 0; t < 256; t++) {
        const int lane = t / 8, item = t % 8;
        const int r = 2 * (lane % 4) + (item % 2) + 8 * ((item / 2) % 2), c = lane / 4 + 8 * (item / 4);
        const int64_t start = (((int64_t)t * bits + bits - 16) % len + len) % len;
        const int64_t w = start / 16;
        const int e = r * 16 + c;
        p->w0[e] = (uint16_t)(w ^ 1);
        p->w1[e] = (uint16_t)(((w + 1) % nw) ^ 1);
        p->shift[e] = (uint8_t)(16 - start % 16);
        p->idx[r][2 * c] = p->w1[e];
        p->idx[r][2 * c + 1] = p->w0[e];
        p->sh[r][c] = p->shift[e];
    }
}

/* Whether the AVX-512 decode may run here (built with it, and the OS saves the AVX-512 state). */
static int wide_ok(void) {
#if EXL3_AVX512
    return ql_os_avx512();
#else
    return 0;
#endif
}

#if EXL3_AVX512
/* A tile's nw words in four registers of 32 (those past nw zero). */
static inline void load_words(const uint16_t *wd, int nw, __m512i a[4]) {
    for (int i = 0; i < 4; i++) {
        const int left = nw - 32 * i;
        const __mmask32 live = left >= 32 ? 0xFFFFFFFFu : left > 0 ? (1u << left) - 1 : 0;
        a[i] = _mm512_maskz_loadu_epi16(live, wd + 32 * i);
    }
}

/* float32 -> float16 -> float32: the one rounding the CUDA __hadd / __hfma make. */
static inline __m512 round_half(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 3inst / mcg: the two float16 halves of the masked product, added: one word permute puts the 16 low halves in
 * the low 256 bits and the 16 high halves above, each widened by VCVTPH2PS. */
static inline __m512 values_lop3(__m512i st, uint32_t mult, uint32_t add) {
    const __m512i halves = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                                            30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(st, _mm512_set1_epi32((int)mult)), _mm512_set1_epi32((int)add));
    /* (x & 0x8FFF8FFF) ^ 0x3B603B60 in one VPTERNLOGD: A = x, B = mask, C = flip; truth table 0x6A */
    x = _mm512_ternarylogic_epi32(x, _mm512_set1_epi32((int)0x8FFF8FFFu), _mm512_set1_epi32(0x3B603B60), 0x6A);
    x = _mm512_permutexvar_epi16(halves, x);
    return round_half(_mm512_add_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(x)),
                                    _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1))));
}

#if defined(__AVX512VNNI__)
#define EXL3_MUL1_ARITH 1
/* mul1: (1024 + the product's byte sum) k_inv + k_bias (every step exact in float32), rounded to float16. */
static inline __m512 values_mul1(__m512i st) {
    const __m512i x = _mm512_mullo_epi32(st, _mm512_set1_epi32((int)0x83DCD12Du));
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_set1_epi32(1024), x, _mm512_set1_epi8(1));
    const __m512 k_inv = _mm512_set1_ps(_cvtsh_ss(0x1EEE)), k_bias = _mm512_set1_ps(_cvtsh_ss(0xC931));
    return round_half(_mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), k_inv, k_bias));
}
#else
#define EXL3_MUL1_ARITH 0
#endif

/* The float32 values of tile row r (16 columns). */
static inline __m512 row_values(const __m512i a[4], const exl3_plan *p, int r, const float *table) {
    const __m512i idx = _mm512_load_si512((const void *)p->idx[r]);
    __m512i pair = _mm512_permutex2var_epi16(a[0], idx, a[1]);
    if (p->nw > 64) {
        const __mmask32 high = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
        pair = _mm512_mask_mov_epi16(pair, high, _mm512_permutex2var_epi16(a[2], idx, a[3]));
    }
    const __m512i st = _mm512_and_si512(_mm512_srlv_epi32(pair, _mm512_load_si512((const void *)p->sh[r])),
                                        _mm512_set1_epi32(0xFFFF));
    if (p->cb == EXL3_3INST)
        return values_lop3(st, 89226354u, 64248484u);
    if (p->cb == EXL3_MCG)
        return values_lop3(st, 0xCBAC1FEDu, 0);
#if EXL3_MUL1_ARITH
    if (p->cb == EXL3_MUL1)
        return values_mul1(st);
#endif
    return _mm512_i32gather_ps(st, table, 4);
}
#endif

/* The value of tile element e (scalar decode). */
static inline float element(const uint16_t *wd, const exl3_plan *p, int e, const float *table) {
    const uint32_t pair = ((uint32_t)wd[p->w0[e]] << 16) | wd[p->w1[e]];
    return table[(pair >> p->shift[e]) & 0xFFFFu];
}

void exl3_decode_tiles(const uint16_t *trellis, const float *table, float *out, int64_t kt_n, int64_t nt_n,
                       int64_t nt0, int64_t nt1, int64_t ldo, int threads, const exl3_plan *p) {
    const int64_t nw = p->nw;
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(threads, kt_n))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(kt_n, &lo, &hi);
        const int wide = wide_ok();
        for (int64_t kt = lo; kt < hi; kt++) {
            for (int64_t nt = nt0; nt < nt1; nt++) {
                const uint16_t *wd = trellis + (kt * nt_n + nt) * nw;
                float *tile = out + kt * 16 * ldo + (nt - nt0) * 16;
#if EXL3_AVX512
                if (wide) {
                    __m512i a[4];
                    load_words(wd, p->nw, a);
                    for (int r = 0; r < 16; r++)
                        _mm512_storeu_ps(tile + r * ldo, row_values(a, p, r, table));
                    continue;
                }
#endif
                (void)wide;
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 16; c++)
                        tile[r * ldo + c] = element(wd, p, r * 16 + c, table);
            }
        }
    }
}

#if EXL3_AVX512
/* Column tiles nt0..nt1-1 times rows x[0..mb) (row stride k) added into y (row stride ldy, zeroed by the caller),
 * tile row by tile row, so the trellis is read in runs of (nt1 - nt0) tiles; a tile's sums live in registers over
 * its 16 rows. */
static inline __attribute__((always_inline)) void mv_block(const uint16_t *trellis, const float *table,
                                                           const float *x, float *y, int64_t k, int64_t ldy,
                                                           int64_t kt_n, int64_t nt_n, int64_t nt0, int64_t nt1,
                                                           const int mb, const exl3_plan *p) {
    for (int64_t kt = 0; kt < kt_n; kt++) {
        const float *xk = x + kt * 16;
        const uint16_t *wd = trellis + (kt * nt_n + nt0) * p->nw;
        for (int64_t nt = nt0; nt < nt1; nt++, wd += p->nw) {
            __m512 acc[EXL3_MV_ROWS];
            __m512i a[4];
            load_words(wd, p->nw, a);
#pragma GCC unroll 16
            for (int j = 0; j < mb; j++)
                acc[j] = _mm512_loadu_ps(y + j * ldy + nt * 16);
            for (int r = 0; r < 16; r++) {
                const __m512 v = row_values(a, p, r, table);
#pragma GCC unroll 16
                for (int j = 0; j < mb; j++)
                    acc[j] = _mm512_fmadd_ps(v, _mm512_set1_ps(xk[j * k + r]), acc[j]);
            }
#pragma GCC unroll 16
            for (int j = 0; j < mb; j++)
                _mm512_storeu_ps(y + j * ldy + nt * 16, acc[j]);
        }
    }
}
#endif

/* The same product with the scalar decode (CPUs without AVX-512 BW), tile column by tile column. */
static void mv_column_scalar(const uint16_t *trellis, const float *table, const float *x, float *y, int64_t k,
                             int64_t ldy, int64_t kt_n, int64_t nt_n, int64_t nt, int mb, const exl3_plan *p) {
    float acc[EXL3_MV_ROWS][16];
    memset(acc, 0, sizeof acc);
    for (int64_t kt = 0; kt < kt_n; kt++) {
        const uint16_t *wd = trellis + (kt * nt_n + nt) * p->nw;
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) {
                const float v = element(wd, p, r * 16 + c, table);
                for (int j = 0; j < mb; j++)
                    acc[j][c] += v * x[j * k + kt * 16 + r];
            }
    }
    for (int j = 0; j < mb; j++)
        memcpy(y + j * ldy + nt * 16, acc[j], sizeof acc[j]);
}

/* column tiles per block of exl3_mv: its sums (EXL3_MV_ROWS x 32 x 16 floats, 32 KB) stay in L1 */
#define MV_BLOCK_TILES 32

void exl3_mv(const uint16_t *trellis, const float *table, const float *x, float *y, int64_t m, int64_t kt_n,
             int64_t nt_n, int threads, const exl3_plan *p) {
    const int64_t k = 16 * kt_n, n = 16 * nt_n;
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(threads, nt_n))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(nt_n, &lo, &hi);
        const int wide = wide_ok();
        for (int64_t m0 = 0; m0 < m; m0 += EXL3_MV_ROWS) {
            const int mb = (int)(m - m0 < EXL3_MV_ROWS ? m - m0 : EXL3_MV_ROWS);
            const float *xm = x + m0 * k;
            float *ym = y + m0 * n;
#if EXL3_AVX512
            if (wide) {
                for (int64_t b0 = lo; b0 < hi; b0 += MV_BLOCK_TILES) {
                    const int64_t b1 = b0 + MV_BLOCK_TILES < hi ? b0 + MV_BLOCK_TILES : hi;
                    for (int j = 0; j < mb; j++)
                        memset(ym + j * n + b0 * 16, 0, (size_t)(b1 - b0) * 16 * sizeof(float));
                    switch (mb) { /* a constant row count per case: the sums stay in registers */
#define MV_CASE(R) case R: mv_block(trellis, table, xm, ym, k, n, kt_n, nt_n, b0, b1, R, p); break;
                    MV_CASE(1) MV_CASE(2) MV_CASE(3) MV_CASE(4) MV_CASE(5) MV_CASE(6) MV_CASE(7) MV_CASE(8)
                    MV_CASE(9) MV_CASE(10) MV_CASE(11) MV_CASE(12) MV_CASE(13) MV_CASE(14) MV_CASE(15)
                    default: mv_block(trellis, table, xm, ym, k, n, kt_n, nt_n, b0, b1, EXL3_MV_ROWS, p); break;
#undef MV_CASE
                    }
                }
                continue;
            }
#endif
            (void)wide;
            for (int64_t nt = lo; nt < hi; nt++)
                mv_column_scalar(trellis, table, xm, ym, k, n, kt_n, nt_n, nt, mb, p);
        }
    }
}

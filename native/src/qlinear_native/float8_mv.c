/* FP8 and FP4 weights times bfloat16 activations with AVX-512 (any M; the choice up to M = 2, AMX above:
 * float8_amx.c); formats in float8.h.
 *
 * Why float32 FMAs rather than VDPBF16PS: on this CPU a VDPBF16PS (32 products) costs as much as four or five
 * 16-lane FMAs, and the decoded weight converts to float32 with one shift or one AND per 16 values (measured:
 * FP8 M = 1 2.7 ms with FMAs vs 3.1 with VDPBF16PS; FP4 2.2-2.4 vs 2.4-2.8, 4096x14336). Both kernels are
 * bound by these vector operations, not by the weight stream (one thread reads the 56 MiB of FP8 codes in
 * about 2 ms, the 28 MiB of FP4 codes in 1 ms).
 *
 * FP8: a 64-byte load holds 64 codes of one channel. Two VPERMI2B lookups on the 7-bit magnitude give the
 * low and the high byte of the code's exact bfloat16 value (subnormal codes included: the tables hold the
 * normal bfloat16 of each value, never a bit-shifted code), one VPTERNLOG puts the sign into the high byte,
 * VPUNPCKL/HBW interleave them into 2 x 32 bfloat16 words, and a shift / an AND make 4 x 16 float32 weights
 * (bf16 << 16 is the float32 of the same value). The activations are converted once per call to float32 in
 * the order those lanes take: per 64 columns, lane d of the four vectors holds column
 * 16 (d / 4) + 2 (d % 4) + {0, 1, 8, 9}. Products are exact in float32 and summed in float32 per scale block,
 * then scaled: tot += acc * scale[n, b] (bk % 64 == 0; for bk % 64 == 32 each 64-column chunk is scaled by a
 * vector holding its two blocks' scales, lanes 0-7 and 8-15).
 * FP4: a 64-byte load holds 128 codes; VPSRLD by 4i and VPERMPS (which reads an index's low 4 bits) turn
 * nibble i of every dword into the float32 E2M1 value (exact), 8 vectors of 16: lane d of vector i is column
 * 8 d + i of the 128. Summed over the 8 vectors, lane d holds columns of one scale block (NVFP4: block d / 2,
 * MXFP4: d / 4), scaled by the block's float32 scale: tot += acc * [s_0 s_0 s_1 s_1 ...]; y = g * sum(tot).
 * The FP4 scale bytes of 8 channels are converted to float32 first (e4m3 through float16 and VCVTPH2PS, exact
 * for subnormal scales too; E8M0 by shifting e into the exponent, e = 0 giving 2**-127, 255 NaN).
 * Rows: 1, 2 or 4 activation rows share each decoded chunk, with 8, 4 or 2 channels in flight (8 independent
 * FMA chains). Channels are split over OpenMP threads in units of 8.
 */
#include "float8.h"
#include <math.h>
#include <stdlib.h>

uint8_t qf_fp8_lo[2][128], qf_fp8_hi[2][128];
float qf_e2m1[16];
uint16_t qf_nv_tab[256][16], qf_mx_tab[256][16];

static uint16_t bits16(float f) { /* bfloat16 of a float32 that is one (low half zero), or of NaN / inf */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(isnan(f) ? 0x7FC0 : u >> 16);
}

/* Value of float8 magnitude c (0..127) of format f, from the format definitions. */
static float fp8_value(int f, int c) {
    if (f == QF_E4M3) {
        const int e = c >> 3, m = c & 7;
        if (c == 127)
            return NAN;
        return e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    }
    const int e = c >> 2, m = c & 3;
    if (e == 31)
        return m ? NAN : INFINITY;
    return e ? ldexpf(1.0f + m / 4.0f, e - 15) : ldexpf(m / 4.0f, -14);
}

void qf_init(void) {
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int q = 0; q < 16; q++)
        qf_e2m1[q] = q & 8 ? -e2m1[q & 7] : e2m1[q & 7];
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 128; c++) {
            const uint16_t b = bits16(fp8_value(f, c));
            qf_fp8_lo[f][c] = (uint8_t)(b & 0xFF);
            qf_fp8_hi[f][c] = (uint8_t)(b >> 8);
        }
    for (int s = 0; s < 256; s++) {
        const float nv = (s & 128 ? -1.0f : 1.0f) * fp8_value(QF_E4M3, s & 127);
        const float mx = s == 255 ? NAN : ldexpf(1.0f, s - 127);
        for (int q = 0; q < 16; q++) {
            qf_nv_tab[s][q] = bits16(qf_e2m1[q] * nv); /* exact: at most 6 significant bits, a normal bfloat16 */
            qf_mx_tab[s][q] = ql_bf16(qf_e2m1[q] * mx); /* exact for 2 <= s <= 252 */
        }
    }
}

#if QL_X86
int qf_mv_ready(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    /* AVX512 F, DQ, BW, VL; VBMI */
    return (b >> 16) & 1 && (b >> 17) & 1 && (b >> 30) & 1 && (b >> 31) & 1 && (c >> 1) & 1 && ql_os_avx512();
}

#define AI __attribute__((always_inline))
/* Bytes ahead in each FP4 weight row prefetched (512 to 2048 equal within noise; none: 10-20% slower). FP8
 * runs as fast without (8 rows of 4 KiB stream well; 1024 measured 5-15% slower). */
#ifndef QF_MV_PREFETCH
#define QF_MV_PREFETCH 1024
#endif

/* ---- FP8 ---- */

/* Row i of x as float32 in the kernel's lane order, K rounded up to kp (a multiple of 64), zeros past K. */
static void fp8_x(const uint16_t *x, int64_t k, int64_t kp, float *xf) {
    for (int64_t c0 = 0; c0 < kp; c0 += 64)
        for (int d = 0; d < 16; d++) {
            const int64_t base = c0 + 16 * (d / 4) + 2 * (d % 4);
            static const int off[4] = {0, 1, 8, 9};
            for (int v = 0; v < 4; v++) {
                const int64_t col = base + off[v];
                uint32_t u = col < k ? (uint32_t)x[col] << 16 : 0;
                memcpy(xf + c0 + 16 * v + d, &u, 4);
            }
        }
}

typedef struct {
    __m512i l0, l1, h0, h1, sign, high;
} fp8_tabs;

QF_TARGET static inline void fp8_tables(fp8_tabs *t, int fmt) {
    t->l0 = _mm512_loadu_si512((const void *)qf_fp8_lo[fmt]);
    t->l1 = _mm512_loadu_si512((const void *)(qf_fp8_lo[fmt] + 64));
    t->h0 = _mm512_loadu_si512((const void *)qf_fp8_hi[fmt]);
    t->h1 = _mm512_loadu_si512((const void *)(qf_fp8_hi[fmt] + 64));
    t->sign = _mm512_set1_epi8((char)0x80);
    t->high = _mm512_set1_epi32((int)0xFFFF0000u);
}

/* 64 codes -> four float32 vectors (lane order in the header). */
QF_TARGET static inline AI void fp8_decode(const fp8_tabs *t, __m512i v, __m512 w[4]) {
    __m512i lo = _mm512_permutex2var_epi8(t->l0, v, t->l1), hi = _mm512_permutex2var_epi8(t->h0, v, t->h1);
    hi = _mm512_ternarylogic_epi32(hi, v, t->sign, 0xF8); /* hi | (v & 0x80) */
    const __m512i a = _mm512_unpacklo_epi8(lo, hi), b = _mm512_unpackhi_epi8(lo, hi);
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(a, t->high));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(b, t->high));
}

/* Chunk [kk, kk + 64) of NC channels into acc[R][NC] (R rows of xf, pitch kp); the last chunk may hold 32. */
#define FP8_CHUNK(R, NC, acc, kk, full)                                                                         \
    for (int j = 0; j < (NC); j++) {                                                                            \
        const __m512i v = (full) ? _mm512_loadu_si512((const void *)(rows[j] + (kk)))                           \
                                 : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[j] + (kk)))); \
        __m512 w[4];                                                                                            \
        fp8_decode(t, v, w);                                                                                    \
        for (int r = 0; r < (R); r++) {                                                                         \
            const float *xr = xf + r * kp + (kk);                                                               \
            for (int q = 0; q < 4; q++)                                                                         \
                acc[r][j] = _mm512_fmadd_ps(w[q], _mm512_loadu_ps(xr + 16 * q), acc[r][j]);                    \
        }                                                                                                       \
    }

/* R rows (xf: their float32 activations) times channels n0 .. n0 + NC - 1 (those past N computed on row N - 1
 * and dropped), written to out rows i0 .. i0 + R - 1. pair: bk % 64 == 32 (per-chunk scale vectors). */
QF_TARGET static inline AI void fp8_group(const qf_call *c, const fp8_tabs *t, const float *xf, int64_t kp,
                                          int64_t i0, int64_t n0, const int R, const int NC, const int pair) {
    const int64_t k = c->k, bk = c->blk < k ? c->blk : k, nb = (k + bk - 1) / bk;
    const float *sc = (const float *)c->scale;
    const uint8_t *rows[8];
    const float *srow[8];
    for (int j = 0; j < NC; j++) {
        const int64_t ch = n0 + j < c->n ? n0 + j : c->n - 1;
        rows[j] = c->w + ch * k;
        srow[j] = sc + ch * nb;
    }
    __m512 tot[4][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            tot[r][j] = _mm512_setzero_ps();
    if (!pair) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t k1 = (b + 1) * bk < k ? (b + 1) * bk : k;
            __m512 acc[4][8];
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NC; j++)
                    acc[r][j] = _mm512_setzero_ps();
            int64_t kk = b * bk;
            for (; kk + 64 <= k1; kk += 64) {
                FP8_CHUNK(R, NC, acc, kk, 1)
            }
            if (kk < k1) {
                FP8_CHUNK(R, NC, acc, kk, 0)
            }
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NC; j++)
                    tot[r][j] = _mm512_fmadd_ps(acc[r][j], _mm512_set1_ps(srow[j][b]), tot[r][j]);
        }
    } else {
        for (int64_t kk = 0; kk < k; kk += 64) {
            __m512 acc[4][8];
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NC; j++)
                    acc[r][j] = _mm512_setzero_ps();
            if (kk + 64 <= k) {
                FP8_CHUNK(R, NC, acc, kk, 1)
            } else {
                FP8_CHUNK(R, NC, acc, kk, 0)
            }
            for (int j = 0; j < NC; j++) {
                const float s1 = kk + 32 < k ? srow[j][(kk + 32) / bk] : 0.0f;
                const __m512 s = _mm512_insertf32x8(_mm512_set1_ps(srow[j][kk / bk]), _mm256_set1_ps(s1), 1);
                for (int r = 0; r < R; r++)
                    tot[r][j] = _mm512_fmadd_ps(acc[r][j], s, tot[r][j]);
            }
        }
    }
    float y[4][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            y[r][j] = _mm512_reduce_add_ps(tot[r][j]);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC && n0 + j < c->n; j++)
            qf_put(c, i0 + r, n0 + j, y[r][j]);
}

/* Output channels [n_lo, n_hi) (n_lo a multiple of 8 apart from the caller's start) for all rows. */
QF_TARGET static void fp8_units(const qf_call *c, const float *xf, int64_t kp, int64_t n_lo, int64_t n_hi) {
    fp8_tabs tabs, *t = &tabs;
    fp8_tables(t, c->fmt);
    const int pair = c->blk < c->k && c->blk % 64 != 0;
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += 8)
        for (int64_t i = 0; i < c->m;) {
            const float *xi = xf + i * kp;
            if (c->m - i >= 4) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 2)
                    pair ? fp8_group(c, t, xi, kp, i, j, 4, 2, 1) : fp8_group(c, t, xi, kp, i, j, 4, 2, 0);
                i += 4;
            } else if (c->m - i >= 2) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 4)
                    pair ? fp8_group(c, t, xi, kp, i, j, 2, 4, 1) : fp8_group(c, t, xi, kp, i, j, 2, 4, 0);
                i += 2;
            } else {
                pair ? fp8_group(c, t, xi, kp, i, n0, 1, 8, 1) : fp8_group(c, t, xi, kp, i, n0, 1, 8, 0);
                i += 1;
            }
        }
}

int qf_fp8_mv(const qf_call *c) {
    const int64_t kp = (c->k + 63) / 64 * 64, units = (c->n + 7) / 8;
    float *xf = aligned_alloc(64, (size_t)(c->m * kp) * sizeof(float));
    if (!xf)
        return -1;
    for (int64_t i = 0; i < c->m; i++)
        fp8_x(c->x + i * c->ldx, c->k, kp, xf + i * kp);
    const int threads = ql_threads(c->threads, units);
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        fp8_units(c, xf, kp, lo * 8, hi * 8 < c->n ? hi * 8 : c->n);
    }
    free(xf);
    return 0;
}

/* ---- FP4 ---- */

/* Row of x as float32 in the kernel's lane order: per 128 columns, [i][d] holds column 8 d + i. */
static void fp4_x(const uint16_t *x, int64_t k, int64_t kp, float *xf) {
    for (int64_t c0 = 0; c0 < kp; c0 += 128)
        for (int i = 0; i < 8; i++)
            for (int d = 0; d < 16; d++) {
                const int64_t col = c0 + 8 * d + i;
                uint32_t u = col < k ? (uint32_t)x[col] << 16 : 0;
                memcpy(xf + c0 + 16 * i + d, &u, 4);
            }
}

/* cnt block-scale bytes -> their exact bfloat16 (NVFP4: e4m3fn through the FP8 tables, 64 at a time;
 * MXFP4: E8M0 e as the exponent field e << 7, e = 0 giving 2**-127 (a bfloat16 denormal, read as the float32
 * denormal 2**-127 after << 16), 255 NaN), zeros up to cnt_pad. */
QF_TARGET static void fp4_scales(const uint8_t *s, int64_t cnt, int64_t cnt_pad, int fmt, uint16_t *out) {
    int64_t i = 0;
    if (fmt == QF_NVFP4) {
        fp8_tabs tabs, *t = &tabs;
        fp8_tables(t, QF_E4M3);
        uint8_t ib[2][64];
        qf_column_order(ib);
        const __m512i nat0 = _mm512_loadu_si512(ib[0]), nat1 = _mm512_loadu_si512(ib[1]);
        for (; i + 64 <= cnt; i += 64) {
            const __m512i v = _mm512_loadu_si512((const void *)(s + i));
            const __m512i lo = _mm512_permutex2var_epi8(t->l0, v, t->l1);
            const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->h0, v, t->h1), v, t->sign, 0xF8);
            _mm512_storeu_si512((void *)(out + i), _mm512_permutex2var_epi8(lo, nat0, hi));
            _mm512_storeu_si512((void *)(out + i + 32), _mm512_permutex2var_epi8(lo, nat1, hi));
        }
        for (; i < cnt; i++)
            out[i] = (uint16_t)(qf_fp8_lo[QF_E4M3][s[i] & 127] | (qf_fp8_hi[QF_E4M3][s[i] & 127] << 8) |
                                ((s[i] & 128) << 8));
    } else {
        for (; i + 32 <= cnt; i += 32) {
            const __m512i e = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(s + i)));
            const __m512i b = _mm512_slli_epi16(e, 7);
            const __mmask32 nan = _mm512_cmpeq_epi16_mask(e, _mm512_set1_epi16(255));
            _mm512_storeu_si512((void *)(out + i), _mm512_mask_mov_epi16(b, nan, _mm512_set1_epi16(0x7FC0)));
        }
        for (; i < cnt; i++)
            out[i] = s[i] == 255 ? 0x7FC0 : (uint16_t)(s[i] << 7);
    }
    for (; i < cnt_pad; i++)
        out[i] = 0;
}

/* Chunk [kk, kk + 128) of channel j (its 64 bytes loaded by `load`) into tot[.][j]. */
#define FP4_CHUNK(load)                                                                                         \
    const __m512i v = (load);                                                                                   \
    __m512 w[8];                                                                                                \
    w[0] = _mm512_permutexvar_ps(v, tab);                                                                       \
    for (int i = 1; i < 8; i++)                                                                                 \
        w[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * i), tab);                                         \
    const __m512i sj = _mm512_loadu_si512((const void *)(sb + j * nsp + kk / bs));                              \
    const __m512 s = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, dup, sj));                 \
    for (int r = 0; r < R; r++) {                                                                               \
        const float *xr = xf + r * kp + kk;                                                                     \
        __m512 acc = _mm512_mul_ps(w[0], _mm512_loadu_ps(xr));                                                  \
        for (int i = 1; i < 8; i++)                                                                             \
            acc = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(xr + 16 * i), acc);                                     \
        tot[r][j] = _mm512_fmadd_ps(acc, s, tot[r][j]);                                                         \
    }

/* R rows times channels n0 .. n0 + NC - 1 (j-th channel's bfloat16 scales at sb + j * nsp). */
QF_TARGET static inline AI void fp4_group(const qf_call *c, const float *xf, int64_t kp, const uint16_t *sb,
                                          int64_t nsp, int64_t i0, int64_t n0, const int R, const int NC) {
    const int64_t k = c->k, bs = c->blk;
    const __m512 tab = _mm512_loadu_ps(qf_e2m1);
    /* scale vector: lane d (the high word of dword d; the low word zeroed) = scale d / 2 (NVFP4) or d / 4 */
    const __m512i dup = bs == 16 ? _mm512_set_epi32(7 << 16, 7 << 16, 6 << 16, 6 << 16, 5 << 16, 5 << 16, 4 << 16,
                                                    4 << 16, 3 << 16, 3 << 16, 2 << 16, 2 << 16, 1 << 16, 1 << 16,
                                                    0, 0)
                                 : _mm512_set_epi32(3 << 16, 3 << 16, 3 << 16, 3 << 16, 2 << 16, 2 << 16, 2 << 16,
                                                    2 << 16, 1 << 16, 1 << 16, 1 << 16, 1 << 16, 0, 0, 0, 0);
    const uint8_t *rows[8];
    for (int j = 0; j < NC; j++)
        rows[j] = c->w + (n0 + j < c->n ? n0 + j : c->n - 1) * (k / 2);
    __m512 tot[4][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            tot[r][j] = _mm512_setzero_ps();
    int64_t kk = 0;
    for (; kk + 128 <= k; kk += 128) {
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            _mm_prefetch((const char *)(rows[j] + kk / 2 + QF_MV_PREFETCH), _MM_HINT_T0);
            FP4_CHUNK(_mm512_loadu_si512((const void *)(rows[j] + kk / 2)))
        }
    }
    if (kk < k) { /* the last 32, 64 or 96 columns */
        const __mmask64 mask = ((__mmask64)1 << ((k - kk) / 2)) - 1;
        for (int j = 0; j < NC; j++) {
            FP4_CHUNK(_mm512_maskz_loadu_epi8(mask, rows[j] + kk / 2))
        }
    }
    float y[4][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            y[r][j] = _mm512_reduce_add_ps(tot[r][j]);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC && n0 + j < c->n; j++)
            qf_put(c, i0 + r, n0 + j, c->g * y[r][j]);
}

/* Channels [n_lo, n_hi), all rows; sb: scratch for 8 channels' bfloat16 scales (8 * nsp). */
QF_TARGET static void fp4_units(const qf_call *c, const float *xf, int64_t kp, int64_t n_lo, int64_t n_hi,
                                uint16_t *sb, int64_t nsp) {
    const int64_t cnt = c->k / c->blk;
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += 8) {
        for (int j = 0; j < 8; j++) {
            const int64_t ch = n0 + j < c->n ? n0 + j : c->n - 1;
            fp4_scales((const uint8_t *)c->scale + ch * cnt, cnt, nsp, c->fmt, sb + j * nsp);
        }
        for (int64_t i = 0; i < c->m;) {
            const float *xi = xf + i * kp;
            if (c->m - i >= 4) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 2)
                    fp4_group(c, xi, kp, sb + (j - n0) * nsp, nsp, i, j, 4, 2);
                i += 4;
            } else if (c->m - i >= 2) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 4)
                    fp4_group(c, xi, kp, sb + (j - n0) * nsp, nsp, i, j, 2, 4);
                i += 2;
            } else {
                fp4_group(c, xi, kp, sb, nsp, i, n0, 1, 8);
                i += 1;
            }
        }
    }
}

/* Scratch of one call: x as float32 [M][kp], then per thread 8 channels' bfloat16 scales (8 x nsp, nsp a
 * multiple of 32 with 32 to spare: a chunk's 32-word scale load stays inside); NULL when out of memory. */
static float *fp4_scratch(const qf_call *c, int threads, int64_t *kp, int64_t *nsp) {
    *kp = (c->k + 127) / 128 * 128;
    *nsp = (*kp / c->blk + 63) / 32 * 32;
    float *buf = aligned_alloc(64, (size_t)(c->m * *kp) * sizeof(float) + (size_t)(threads * 8 * *nsp) * 2);
    if (buf)
        for (int64_t i = 0; i < c->m; i++)
            fp4_x(c->x + i * c->ldx, c->k, *kp, buf + i * *kp);
    return buf;
}

int qf_fp4_mv_range(const qf_call *c, int64_t n_lo, int64_t n_hi) {
    int64_t kp, nsp;
    float *buf = fp4_scratch(c, 1, &kp, &nsp);
    if (!buf)
        return -1;
    fp4_units(c, buf, kp, n_lo, n_hi, (uint16_t *)(buf + c->m * kp), nsp);
    free(buf);
    return 0;
}

int qf_fp4_mv(const qf_call *c) {
    const int64_t units = (c->n + 7) / 8;
    const int threads = ql_threads(c->threads, units);
    int64_t kp, nsp;
    float *buf = fp4_scratch(c, threads, &kp, &nsp);
    if (!buf)
        return -1;
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        fp4_units(c, buf, kp, lo * 8, hi * 8 < c->n ? hi * 8 : c->n,
                  (uint16_t *)(buf + c->m * kp) + QL_THREAD * 8 * nsp, nsp);
    }
    free(buf);
    return 0;
}
#else
int qf_mv_ready(void) { return 0; }
#endif

/* 4-bit look-up-table weights (bitsandbytes NF4 / FP4) times bfloat16 or float32 activations with AVX-512 float32
 * FMAs, any M (the choice for small M; AMX above: lut4_mm.c); layout in lut4.h.
 *
 * Per block of a channel, one VMULPS makes the block's table: tab[q] = fl(table[q] * absmax[n, b]), 16 float32 in
 * one register. The codes are read a unit of U columns at a time (U/2 bytes): U = 128 (block % 128 == 0: one
 * 64-byte load), 64 (32 bytes broadcast to both 256-bit halves) or 32 (16 bytes broadcast to the four 128-bit
 * lanes). VPSRLVD moves one nibble of every dword to its low four bits and VPERMPS (which reads an index's low 4
 * bits, ignoring the rest) looks it up: U/16 vectors of 16 exact float32 weights, each multiplied by the matching
 * activations in one FMA. Lane d of vector i reads nibble p = i * (16 / L) + d / L (L = U/8 dwords loaded) of
 * dword d % L, i.e. column 8 (d % L) + 2 (p / 2) + 1 - p % 2 of the unit (high nibble first); the activations are
 * converted once per call to float32 in that order (gathers), so each FMA takes one plain 64-byte load.
 * Per 128 weights and activation row: 8 FMAs, plus 7-8 shifts, 8 VPERMPS and 1-4 VMULPS shared by the rows of a
 * group: rows go 1, 2, 4 or 8 at a time with 8, 4, 2 or 2 channels in flight (8 or more independent FMA chains).
 * Each output lane sums its columns in K order; the 16 lanes are added at the end (fixed order, any thread count).
 * Channels are split over OpenMP threads in units of 8.
 * Measured one thread, NF4 block 64 (benchmarks/results/cpu_bnb_2026-12-04.md): M = 1 in 2.6-3.2 ms on 4096x14336
 * and 14336x4096 (dense bfloat16 F.linear 10-25 ms), about 1.2-1.5 ms more per further row: the choice up to M = 4
 * (bfloat16 with AMX), 6 (bfloat16 without), 32 (float32), see native_lut4.py.
 */
#include "lut4.h"
#include <stdlib.h>

#if QL_X86
static int mv_state = -1; /* -1 unknown, 0 no, 1 yes: CPUID traps to the hypervisor in a VM (~30 us a call) */

int q4_mv_ready(void) {
    if (mv_state < 0) {
        unsigned a, b, c, d;
        /* AVX512 F, DQ, BW, VL */
        mv_state = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 16) & 1 && (b >> 17) & 1 && (b >> 30) & 1 &&
                   (b >> 31) & 1 && ql_os_avx512();
    }
    return mv_state;
}

#define AI __attribute__((always_inline))
/* Prefetch: each code row and absmax row is prefetched at the same position Q4_AHEAD channels further (the
 * next group of 8: a group's rows sit next to each other, so this is a linear stream one group ahead), the
 * codes into L2. Measured one thread on 4096x14336, caches flushed between calls, M = 1: 3.0-3.1 ms; 3.3
 * without the absmax prefetch; 3.8 prefetching 256 bytes ahead in the row instead, 5.0 at 1024 bytes; 16 or 32
 * rows ahead the same as 8. (Dense bfloat16 F.linear: 9.6-10 ms; one thread streams the 28 MiB of codes in 2.5.) */
#ifndef Q4_AHEAD
#define Q4_AHEAD 8
#endif

static int unit_of(int64_t block) { return block % 128 == 0 ? 128 : block % 64 == 0 ? 64 : 32; }

/* Nibble (0..7 of its dword) that lane d of vector i reads in a unit of u columns, and the column it holds. */
static int nibble_of(int u, int i, int d) { return i * (16 / (u / 8)) + d / (u / 8); }
static int column_of(int u, int i, int d) {
    const int p = nibble_of(u, i, d);
    return 8 * (d % (u / 8)) + 2 * (p / 2) + 1 - p % 2;
}

/* Rows of x as float32 [M][K] in the kernel's lane order: [kk + 16 i + d] holds column kk + column_of(u, i, d). */
Q4_TARGET static void convert_x(const q4_call *c, int u, float *xf) {
    int32_t idx[128];
    for (int i = 0; i < u / 16; i++)
        for (int d = 0; d < 16; d++)
            idx[16 * i + d] = column_of(u, i, d);
    for (int64_t r = 0; r < c->m; r++) {
        float *dst = xf + r * c->k;
        if (c->x_f32) {
            const float *src = (const float *)c->x + r * c->ldx;
            for (int64_t kk = 0; kk < c->k; kk += u)
                for (int i = 0; i < u / 16; i++)
                    _mm512_storeu_ps(dst + kk + 16 * i,
                                     _mm512_i32gather_ps(_mm512_loadu_si512((const void *)(idx + 16 * i)), src + kk, 4));
        } else {
            const uint16_t *src = (const uint16_t *)c->x + r * c->ldx;
            float tmp[128];
            for (int64_t kk = 0; kk < c->k; kk += u) {
                for (int j = 0; j < u; j += 16) {
                    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + kk + j)));
                    _mm512_storeu_ps(tmp + j, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
                }
                for (int i = 0; i < u / 16; i++)
                    _mm512_storeu_ps(dst + kk + 16 * i,
                                     _mm512_i32gather_ps(_mm512_loadu_si512((const void *)(idx + 16 * i)), tmp, 4));
            }
        }
    }
}

/* The codes of one unit: U/2 bytes at p, as 16 dwords (see the header comment). */
Q4_TARGET static inline AI __m512i load_unit(const uint8_t *p, const int u) {
    if (u == 128)
        return _mm512_loadu_si512((const void *)p);
    if (u == 64)
        return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
}

/* R rows (from i0) times channels n0 .. n0 + NC - 1 (those past N computed on row N - 1 and dropped); sh[i]: the
 * shift of vector i per lane (4 x nibble). */
Q4_TARGET static inline AI void group(const q4_call *c, const float *xf, int64_t i0, int64_t n0, const int R,
                                      const int NC, const int U, const __m512i *sh) {
    const int64_t k = c->k, blk = c->block, nb = k / blk;
    const __m512 t = _mm512_loadu_ps(c->table);
    const uint8_t *rows[8];
    const float *am[8];
    for (int j = 0; j < NC; j++) {
        const int64_t ch = n0 + j < c->n ? n0 + j : c->n - 1;
        rows[j] = c->codes + ch * (k / 2);
        am[j] = c->absmax + ch * nb;
    }
    const float *xr = xf + i0 * k;
    __m512 acc[8][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            acc[r][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 tab[8];
        for (int j = 0; j < NC; j++) {
            if (b % 16 == 0)
                _mm_prefetch((const char *)(am[j] + b + Q4_AHEAD * nb), _MM_HINT_T0);
            tab[j] = _mm512_mul_ps(t, _mm512_set1_ps(am[j][b]));
        }
        for (int64_t kk = b * blk; kk < (b + 1) * blk; kk += U) {
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) {
                if (U == 128 || kk % 128 == 0)
                    _mm_prefetch((const char *)(rows[j] + kk / 2 + Q4_AHEAD * (k / 2)), _MM_HINT_T1);
                const __m512i v = load_unit(rows[j] + kk / 2, U);
#pragma GCC unroll 8
                for (int i = 0; i < U / 16; i++) {
                    const __m512i q = U == 128 ? (i ? _mm512_srli_epi32(v, 4 * i) : v) : _mm512_srlv_epi32(v, sh[i]);
                    const __m512 w = _mm512_permutexvar_ps(q, tab[j]);
                    for (int r = 0; r < R; r++)
                        acc[r][j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xr + r * k + kk + 16 * i), acc[r][j]);
                }
            }
        }
    }
    float y[8][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC; j++)
            y[r][j] = _mm512_reduce_add_ps(acc[r][j]);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NC && n0 + j < c->n; j++)
            q4_put(c, i0 + r, n0 + j, y[r][j]);
}

/* Channels [n_lo, n_hi) (n_lo a multiple of 8 from the caller's start), all rows, units of U columns. */
Q4_TARGET static inline AI void units(const q4_call *c, const float *xf, int64_t n_lo, int64_t n_hi, const int U) {
    __m512i sh[8];
    for (int i = 0; i < U / 16; i++) {
        int32_t s[16];
        for (int d = 0; d < 16; d++)
            s[d] = 4 * nibble_of(U, i, d);
        sh[i] = _mm512_loadu_si512((const void *)s);
    }
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += 8)
        for (int64_t i = 0; i < c->m;) {
            const int64_t left = c->m - i;
            if (left >= 8) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 2)
                    group(c, xf, i, j, 8, 2, U, sh);
                i += 8;
            } else if (left >= 4) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 2)
                    group(c, xf, i, j, 4, 2, U, sh);
                i += 4;
            } else if (left >= 2) {
                for (int64_t j = n0; j < n0 + 8 && j < n_hi; j += 4)
                    group(c, xf, i, j, 2, 4, U, sh);
                i += 2;
            } else {
                group(c, xf, i, n0, 1, 8, U, sh);
                i += 1;
            }
        }
}

Q4_TARGET static void run_units(const q4_call *c, const float *xf, int64_t n_lo, int64_t n_hi) {
    const int u = unit_of(c->block);
    if (u == 128)
        units(c, xf, n_lo, n_hi, 128);
    else if (u == 64)
        units(c, xf, n_lo, n_hi, 64);
    else
        units(c, xf, n_lo, n_hi, 32);
}

int q4_mv(const q4_call *c) {
    const int64_t groups = (c->n + 7) / 8;
    float *xf = aligned_alloc(64, (size_t)(c->m * c->k) * sizeof(float));
    if (!xf)
        return -1;
    convert_x(c, unit_of(c->block), xf);
    const int threads = ql_threads(c->threads, groups);
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        ql_thread_share(groups, &lo, &hi);
        run_units(c, xf, lo * 8, hi * 8 < c->n ? hi * 8 : c->n);
    }
    free(xf);
    return 0;
}
#else
int q4_mv_ready(void) { return 0; }
#endif

/* GGUF Q8_0, Q4_0 and Q4_1 blocks multiplied as they lie in the file (qlinear_native._blocks): y = x @ W^T,
 * float32 throughout.
 *
 * A row of K weights is K/32 blocks: Q8_0 34 bytes (float16 d, 32 int8 codes; w = d q), Q4_0 18 bytes
 * (float16 d, 16 bytes of nibbles: code j in byte j's low half, code j + 16 in its high half; w = d (q - 8)),
 * Q4_1 20 bytes (float16 d and m, then the Q4_0 nibbles; w = d q + m). Per block and activation row: the
 * codes widened to int32 and converted to float32 (exact), multiplied by x in float32 (exact: 8 + 8
 * significant bits), summed into a 16-lane partial, scaled by d into the row's accumulator (the scales, 16
 * at a time, gathered and converted ahead). The code-independent part (-8 d or m, times the block's sum of
 * x, which the caller passes) is one more dot product per 16 blocks. The weight is read once per call at the
 * bytes the file holds; at about 9 vector operations per 32 weights the loop, not the stream, bounds it on
 * one core. Up to 4 activation rows share each converted block. Output rows are split over `threads`
 * (OpenMP), each row summed by one thread in a fixed order, so results do not depend on the thread count. */
#include <stdint.h>

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__F16C__)
#include <cpuid.h>
#include <immintrin.h>
#define QL_Q8 1
#else
#define QL_Q8 0
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#include "blocks.h"

#define BLOCK 32
/* bytes past the next row pair that the stream is prefetched (0 to 8192 measured equal within noise) */
#define PREFETCH 4096
#define CHUNK 64 /* blocks whose scales are converted ahead at a time */

#if QL_Q8
/* AVX-512 state saved by the OS (XCR0 bits 1, 2, 5, 6, 7), so zmm registers survive context switches. */
int ql_blocks_ready(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1) || !((c >> 29) & 1)) /* OSXSAVE, F16C */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1)) /* AVX512F */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6;
}

#define NR 2 /* output rows per pass (they share each activation load) */

static inline long long bytes_of(ql_block t) { return t == QL_Q8_0 ? 34 : t == QL_Q4_0 ? 18 : 20; }

/* The block's 32 codes as float32: codes 0..15 and 16..31. */
static inline __attribute__((always_inline)) void codes(const uint8_t *blk, const ql_block t, __m512 *lo,
                                                          __m512 *hi) {
    if (t == QL_Q8_0) {
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
    } else {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (t == QL_Q4_0 ? 2 : 4))));
        *lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
        *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    }
}

/* 16 float16 values at byte `at` of blocks b .. b+15 of a row (fewer under `live`), as float32. */
static inline __m512 gather_half(const uint8_t *row, long long b, long long bytes, int at, __mmask16 live) {
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int)bytes));
    const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, lanes, row + b * bytes + at, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}

/* Output rows n .. n+nr-1 against activation rows 0 .. mt-1 (t, nr, mt compile-time after inlining). */
static inline __attribute__((always_inline)) void rows_tile(const float *x, long long ldx, const float *xs,
                                                              const uint8_t *w, long long nblk, float *out,
                                                              long long ldo, long long n, const ql_block t,
                                                              const int nr, const int mt) {
    const long long bytes = bytes_of(t);
    __m512 acc[NR][4], corr[NR][4];
    const uint8_t *row[NR];
    for (int r = 0; r < nr; r++) {
        row[r] = w + (n + r) * nblk * bytes;
        for (int i = 0; i < mt; i++)
            acc[r][i] = corr[r][i] = _mm512_setzero_ps();
    }
    const uint8_t *ahead = w + (n + nr) * nblk * bytes + PREFETCH; /* the stream past these rows (never faults) */
    float dd[NR][CHUNK] __attribute__((aligned(64)));
    for (long long b0 = 0; b0 < nblk; b0 += CHUNK) {
        const long long nb = nblk - b0 < CHUNK ? nblk - b0 : CHUNK;
        for (int r = 0; r < nr; r++) /* the chunk's scales; and the code-independent part per 16 blocks */
            for (long long j = 0; j < nb; j += 16) {
                const __mmask16 live = nb - j >= 16 ? 0xffff : (__mmask16)((1u << (nb - j)) - 1);
                const __m512 d = gather_half(row[r], b0 + j, bytes, 0, live);
                _mm512_store_ps(dd[r] + j, d);
                if (t != QL_Q8_0) {
                    const __m512 c = t == QL_Q4_0 ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f))
                                                  : gather_half(row[r], b0 + j, bytes, 2, live);
                    for (int i = 0; i < mt; i++)
                        corr[r][i] = _mm512_fmadd_ps(c, _mm512_maskz_loadu_ps(live, xs + i * nblk + b0 + j),
                                                     corr[r][i]);
                }
            }
        for (long long b = b0; b < b0 + nb; b++) {
            _mm_prefetch((const char *)(ahead + b * nr * bytes), _MM_HINT_T0);
            __m512 lo[NR], hi[NR];
            for (int r = 0; r < nr; r++)
                codes(row[r] + b * bytes, t, &lo[r], &hi[r]);
            for (int i = 0; i < mt; i++) {
                const float *xb = x + i * ldx + b * BLOCK;
                const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
                for (int r = 0; r < nr; r++) /* the scale comes from memory, broadcast by the load itself */
                    acc[r][i] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi[r], x1, _mm512_mul_ps(lo[r], x0)),
                                                _mm512_set1_ps(dd[r][b - b0]), acc[r][i]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < mt; i++)
            out[i * ldo + n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][i], corr[r][i]));
}

/* One body per (type, rows, tile height): the accumulators stay in registers. */
#define TILE(T, NROWS)                                                                                           \
    static void tile_##T##_##NROWS(const float *x, long long ldx, const float *xs, const uint8_t *w,            \
                                   long long nblk, float *out, long long ldo, long long n, int mt) {          \
        switch (mt) {                                                                                          \
        case 1: rows_tile(x, ldx, xs, w, nblk, out, ldo, n, T, NROWS, 1); break;                                 \
        case 2: rows_tile(x, ldx, xs, w, nblk, out, ldo, n, T, NROWS, 2); break;                                 \
        case 3: rows_tile(x, ldx, xs, w, nblk, out, ldo, n, T, NROWS, 3); break;                                 \
        default: rows_tile(x, ldx, xs, w, nblk, out, ldo, n, T, NROWS, 4); break;                                \
        }                                                                                                      \
    }
TILE(QL_Q8_0, 1)
TILE(QL_Q8_0, 2)
TILE(QL_Q4_0, 1)
TILE(QL_Q4_0, 2)
TILE(QL_Q4_1, 1)
TILE(QL_Q4_1, 2)

typedef void (*tile_fn)(const float *, long long, const float *, const uint8_t *, long long, float *, long long,
                        long long, int);

void ql_blocks_mm(ql_block t, const float *x, long long ldx, const float *xs, const uint8_t *w, float *out,
                  long long ldo, long long m, long long k, long long n, int threads) {
    const long long nblk = k / BLOCK, tiles = (n + NR - 1) / NR;
    const tile_fn one = t == QL_Q8_0 ? tile_QL_Q8_0_1 : t == QL_Q4_0 ? tile_QL_Q4_0_1 : tile_QL_Q4_1_1;
    const tile_fn two = t == QL_Q8_0 ? tile_QL_Q8_0_2 : t == QL_Q4_0 ? tile_QL_Q4_0_2 : tile_QL_Q4_1_2;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long i = 0; i < tiles; i++)
        for (long long m0 = 0; m0 < m; m0 += 4) {
            const int mt = m - m0 < 4 ? (int)(m - m0) : 4;
            const float *xt = x + m0 * ldx, *st = xs ? xs + m0 * nblk : xs;
            if (i * NR + NR <= n)
                two(xt, ldx, st, w, nblk, out + m0 * ldo, ldo, i * NR, mt);
            else
                for (long long r = i * NR; r < n; r++)
                    one(xt, ldx, st, w, nblk, out + m0 * ldo, ldo, r, mt);
        }
}
#else
int ql_blocks_ready(void) { return 0; }

void ql_blocks_mm(ql_block t, const float *x, long long ldx, const float *xs, const uint8_t *w, float *out,
                  long long ldo, long long m, long long k, long long n, int threads) {
    (void)t, (void)x, (void)ldx, (void)xs, (void)w, (void)out, (void)ldo, (void)m, (void)k, (void)n, (void)threads;
}
#endif

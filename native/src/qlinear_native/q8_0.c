/* GGUF Q8_0 blocks multiplied as they lie in the file (qlinear_native._q8): y = x @ W^T, float32 throughout.
 *
 * A Q8_0 row of K weights is K/32 blocks of 34 bytes: a float16 scale d, then 32 int8 codes q; w = d * q.
 * Per block and activation row: two 16-code halves sign-extended to int32 and converted to float32 (exact),
 * multiplied by x in float32 (q * x is exact: 8 + 8 significant bits), summed into a 16-lane partial, then
 * scaled by d into the row's accumulator (the scales, 16 at a time, gathered and converted ahead). The weight
 * is read once per call at the bytes the file holds (8.5 bits per weight); at about 9 vector operations per
 * 32 weights the loop, not the stream, bounds it on one core. Up to 4 activation rows share each converted
 * block. Output rows are split over `threads` (OpenMP), each row summed by one thread in a
 * fixed order, so results do not depend on the thread count. */
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

#define BLOCK 32
#define BYTES 34
/* bytes past the next row pair that the stream is prefetched (0 to 8192 measured equal within noise) */
#define PREFETCH 4096
#define CHUNK 64 /* blocks whose scales are converted ahead at a time */

#if QL_Q8
/* AVX-512 state saved by the OS (XCR0 bits 1, 2, 5, 6, 7), so zmm registers survive context switches. */
int ql_q8_ready(void) {
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

/* Output rows n .. n+nr-1 against activation rows 0 .. mt-1 (nr, mt compile-time after inlining). */
static inline __attribute__((always_inline)) void rows_tile(const float *x, long long ldx, const uint8_t *w,
                                                              long long nblk, float *out, long long ldo, long long n,
                                                              const int nr, const int mt) {
    __m512 acc[NR][4];
    const uint8_t *row[NR];
    for (int r = 0; r < nr; r++) {
        row[r] = w + (n + r) * nblk * BYTES;
        for (int i = 0; i < mt; i++)
            acc[r][i] = _mm512_setzero_ps();
    }
    const uint8_t *ahead = w + (n + nr) * nblk * BYTES + PREFETCH; /* the stream past these rows (never faults) */
    const __m512i lane34 = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(BYTES));
    float dd[NR][CHUNK] __attribute__((aligned(64)));
    for (long long b0 = 0; b0 < nblk; b0 += CHUNK) {
        const long long nb = nblk - b0 < CHUNK ? nblk - b0 : CHUNK;
        for (int r = 0; r < nr; r++) /* the chunk's block scales: 16 gathered at a time, float16 -> float32 */
            for (long long j = 0; j < nb; j += 16) {
                const __mmask16 live = nb - j >= 16 ? 0xffff : (__mmask16)((1u << (nb - j)) - 1);
                const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, lane34,
                                                              row[r] + (b0 + j) * BYTES, 1);
                _mm512_store_ps(dd[r] + j, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
            }
        for (long long b = b0; b < b0 + nb; b++) {
            _mm_prefetch((const char *)(ahead + b * nr * BYTES), _MM_HINT_T0);
            __m512 lo[NR], hi[NR];
            for (int r = 0; r < nr; r++) {
                const uint8_t *blk = row[r] + b * BYTES;
                lo[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
                hi[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
            }
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
            out[i * ldo + n + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#define TILE(NROWS)                                                                                              \
    static void tile_##NROWS(const float *x, long long ldx, const uint8_t *w, long long nblk, float *out,       \
                             long long ldo, long long n, int mt) {                                            \
        switch (mt) { /* one body per tile height: the accumulators stay in registers */                       \
        case 1: rows_tile(x, ldx, w, nblk, out, ldo, n, NROWS, 1); break;                                        \
        case 2: rows_tile(x, ldx, w, nblk, out, ldo, n, NROWS, 2); break;                                        \
        case 3: rows_tile(x, ldx, w, nblk, out, ldo, n, NROWS, 3); break;                                        \
        default: rows_tile(x, ldx, w, nblk, out, ldo, n, NROWS, 4); break;                                       \
        }                                                                                                      \
    }
TILE(1)
TILE(NR)

void ql_q8_0_mm(const float *x, long long ldx, const uint8_t *w, float *out, long long ldo, long long m,
                long long k, long long n, int threads) {
    const long long nblk = k / BLOCK, tiles = (n + NR - 1) / NR;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long t = 0; t < tiles; t++)
        for (long long m0 = 0; m0 < m; m0 += 4) {
            const int mt = m - m0 < 4 ? (int)(m - m0) : 4;
            if (t * NR + NR <= n)
                tile_NR(x + m0 * ldx, ldx, w, nblk, out + m0 * ldo, ldo, t * NR, mt);
            else
                for (long long r = t * NR; r < n; r++)
                    tile_1(x + m0 * ldx, ldx, w, nblk, out + m0 * ldo, ldo, r, mt);
        }
}
#else
int ql_q8_ready(void) { return 0; }

void ql_q8_0_mm(const float *x, long long ldx, const uint8_t *w, float *out, long long ldo, long long m,
                long long k, long long n, int threads) {
    (void)x, (void)ldx, (void)w, (void)out, (void)ldo, (void)m, (void)k, (void)n, (void)threads;
}
#endif

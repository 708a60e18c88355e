/* GGUF Q8_0, Q4_0, Q4_1 and Q4_K blocks multiplied as they lie in the file (qlinear_native._blocks):
 * y = x @ W^T, float32 throughout.
 *
 * A row of K weights is K/32 blocks: Q8_0 34 bytes (float16 d, 32 int8 codes; w = d q), Q4_0 18 bytes
 * (float16 d, 16 bytes of nibbles: code j in byte j's low half, code j + 16 in its high half; w = d (q - 8)),
 * Q4_1 20 bytes (float16 d and m, then the Q4_0 nibbles; w = d q + m); Q4_K super-blocks of 256 values in 144
 * bytes (float16 d and dmin, 8 packed 6-bit scales and minimums, then 4 chunks of 32 bytes whose low nibbles
 * are one 32-value sub-block and high nibbles the next; w = d sc q - dmin m). Per block and activation row: the
 * codes widened to int32 and converted to float32 (exact), multiplied by x in float32 (exact: 8 + 8
 * significant bits), summed into a 16-lane partial, scaled by d into the row's accumulator (the scales, 16
 * at a time, gathered and converted ahead). The code-independent part (-8 d, m or -dmin m, times the block's
 * sum of x, which the caller passes) is one more dot product per 16 blocks. The weight is read once per call at the
 * bytes the file holds; at about 9 vector operations per 32 weights the loop, not the stream, bounds it on
 * one core. Up to 4 activation rows share each converted block. Output rows are split over `threads`
 * (OpenMP), each row summed by one thread in a fixed order, so results do not depend on the thread count. */
#include "cpu_common.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__F16C__)
#define QL_Q8 1
#else
#define QL_Q8 0
#endif

#include "blocks.h"

#define BLOCK 32
/* bytes past the next row pair that the stream is prefetched (0 to 8192 measured equal within noise) */
#define PREFETCH 4096
#define CHUNK 64 /* blocks whose scales are converted ahead at a time */

#if QL_Q8
/* F16C and AVX512F, with the AVX-512 state saved by the OS, so zmm registers survive context switches. */
int ql_blocks_ready(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 29) & 1)) /* F16C */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1)) /* AVX512F */
        return 0;
    return ql_os_avx512();
}

#define NR 2 /* output rows per pass (they share each activation load) */

/* Bytes of a legacy block (32 values). */
static inline long long block_bytes(ql_block t) { return t == QL_Q8_0 ? 34 : t == QL_Q4_0 ? 18 : 20; }

/* Bytes of one row of nblk 32-value blocks (Q4_K: nblk / 8 super-blocks of 144 bytes). */
static inline long long row_bytes(ql_block t, long long nblk) {
    return t == QL_Q4_K ? nblk / 8 * 144 : t == QL_Q6_K ? nblk / 8 * 210 : nblk * block_bytes(t);
}

/* Q4_K sub-block j (0..7) of a super-block: its 6-bit scale and minimum (ggml's get_scale_min_k4). */
static inline void q4k_scale_min(const uint8_t *sc, int j, int *s, int *m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* The 32 codes of 32-value block b of a row as float32: codes 0..15 and 16..31. */
static inline __attribute__((always_inline)) void codes(const uint8_t *row, long long b, const ql_block t,
                                                          __m512 *lo, __m512 *hi) {
    if (t == QL_Q6_K) { /* quarter qd of half h: low or high nibbles of 32 ql bytes, 2 bits of 32 qh bytes */
        const int j = (int)(b % 8), h = j / 4, qd = j % 4;
        const uint8_t *sb = row + b / 8 * 210, *ql = sb + h * 64 + (qd % 2) * 32, *qh = sb + 128 + h * 32;
        const __m128i nib = _mm_cvtsi32_si128(4 * (qd / 2)), two = _mm_cvtsi32_si128(2 * qd);
        const __m512i f = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3), c32 = _mm512_set1_epi32(32);
        for (int half = 0; half < 2; half++) {
            const __m512i l = _mm512_and_si512(
                _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + 16 * half))), nib), f);
            const __m512i u = _mm512_and_si512(
                _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * half))), two),
                three);
            const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(u, 4)), c32));
            if (half)
                *hi = q;
            else
                *lo = q;
        }
        return;
    }
    if (t == QL_Q4_K) { /* 64-value chunk (b % 8) / 2 of the super-block: 32 bytes, low nibbles first */
        const uint8_t *q = row + b / 8 * 144 + 16 + (b % 8) / 2 * 32;
        const __m128i shift = _mm_cvtsi32_si128(4 * (int)(b & 1));
        const __m512i low = _mm512_set1_epi32(15);
        *lo = _mm512_cvtepi32_ps(_mm512_and_si512(
            _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)), shift), low));
        *hi = _mm512_cvtepi32_ps(_mm512_and_si512(
            _mm512_srl_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))), shift), low));
        return;
    }
    const uint8_t *blk = row + b * block_bytes(t);
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

/* Scale (into d) and code-independent part (into c: -8 d for Q4_0, m for Q4_1, -dmin m for Q4_K; unused for
 * Q8_0) of blocks b0 .. b0+nb-1 of a row: 16 gathered at a time, Q4_K's from its packed 6-bit fields. Q6_K has
 * two 16-value sub-blocks per block: d gets the first one's scale, c the second's. */
static inline __attribute__((always_inline)) void scales(const uint8_t *row, long long b0, long long nb,
                                                           const ql_block t, float *d, float *c) {
    if (t == QL_Q6_K) { /* whole super-blocks, as for Q4_K; int8 scales per 16 values, d at the end */
        for (long long b = b0; b < b0 + nb; b += 8) {
            const uint8_t *sb = row + b / 8 * 210;
            uint16_t h;
            __builtin_memcpy(&h, sb + 208, 2);
            const float dv = _cvtsh_ss(h);
            const int8_t *sc = (const int8_t *)(sb + 192);
            for (int j = 0; j < 8; j++) {
                d[b - b0 + j] = dv * (float)sc[2 * j];
                c[b - b0 + j] = dv * (float)sc[2 * j + 1];
            }
        }
        return;
    }
    if (t == QL_Q4_K) { /* b0 and nb are whole super-blocks (CHUNK and K both multiples of 8 blocks) */
        for (long long b = b0; b < b0 + nb; b += 8) {
            const uint8_t *sb = row + b / 8 * 144;
            uint16_t h[2];
            __builtin_memcpy(h, sb, 4);
            const float dv = _cvtsh_ss(h[0]), dmin = _cvtsh_ss(h[1]);
            for (int j = 0; j < 8; j++) {
                int s, m;
                q4k_scale_min(sb + 4, j, &s, &m);
                d[b - b0 + j] = dv * (float)s;
                c[b - b0 + j] = -dmin * (float)m;
            }
        }
        return;
    }
    const long long bytes = block_bytes(t);
    for (long long j = 0; j < nb; j += 16) {
        const __mmask16 live = nb - j >= 16 ? 0xffff : (__mmask16)((1u << (nb - j)) - 1);
        const __m512 dv = gather_half(row, b0 + j, bytes, 0, live);
        _mm512_store_ps(d + j, dv);
        if (t == QL_Q4_0)
            _mm512_store_ps(c + j, _mm512_mul_ps(dv, _mm512_set1_ps(-8.0f)));
        else if (t == QL_Q4_1)
            _mm512_store_ps(c + j, gather_half(row, b0 + j, bytes, 2, live));
    }
}

/* Output rows n .. n+nr-1 against activation rows 0 .. mt-1 (t, nr, mt compile-time after inlining). */
static inline __attribute__((always_inline)) void rows_tile(const float *x, long long ldx, const float *xs,
                                                              const uint8_t *w, long long nblk, float *out,
                                                              long long ldo, long long n, const ql_block t,
                                                              const int nr, const int mt) {
    const long long bytes = row_bytes(t, nblk);
    __m512 acc[NR][4], corr[NR][4];
    const uint8_t *row[NR];
    for (int r = 0; r < nr; r++) {
        row[r] = w + (n + r) * bytes;
        for (int i = 0; i < mt; i++)
            acc[r][i] = corr[r][i] = _mm512_setzero_ps();
    }
    const uint8_t *ahead = w + (n + nr) * bytes + PREFETCH; /* the stream past these rows (never faults) */
    const long long step = bytes / nblk + 1;                   /* prefetch stride per block and row, rounded up */
    float dd[NR][CHUNK] __attribute__((aligned(64))), cc[NR][CHUNK] __attribute__((aligned(64)));
    for (long long b0 = 0; b0 < nblk; b0 += CHUNK) {
        const long long nb = nblk - b0 < CHUNK ? nblk - b0 : CHUNK;
        for (int r = 0; r < nr; r++) { /* the chunk's scales; the code-independent part, 16 blocks at a time */
            scales(row[r], b0, nb, t, dd[r], cc[r]);
            if (t != QL_Q8_0 && t != QL_Q6_K)
                for (long long j = 0; j < nb; j += 16) {
                    const __mmask16 live = nb - j >= 16 ? 0xffff : (__mmask16)((1u << (nb - j)) - 1);
                    const __m512 cv = _mm512_maskz_loadu_ps(live, cc[r] + j);
                    for (int i = 0; i < mt; i++)
                        corr[r][i] = _mm512_fmadd_ps(cv, _mm512_maskz_loadu_ps(live, xs + i * nblk + b0 + j),
                                                     corr[r][i]);
                }
        }
        for (long long b = b0; b < b0 + nb; b++) {
            _mm_prefetch((const char *)(ahead + b * nr * step), _MM_HINT_T0);
            __m512 lo[NR], hi[NR];
            for (int r = 0; r < nr; r++)
                codes(row[r], b, t, &lo[r], &hi[r]);
            for (int i = 0; i < mt; i++) {
                const float *xb = x + i * ldx + b * BLOCK;
                const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
                for (int r = 0; r < nr; r++) /* the scale comes from memory, broadcast by the load itself */
                    if (t == QL_Q6_K) /* a scale per 16 values */
                        acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(hi[r], x1), _mm512_set1_ps(cc[r][b - b0]),
                                                    _mm512_fmadd_ps(_mm512_mul_ps(lo[r], x0),
                                                                    _mm512_set1_ps(dd[r][b - b0]), acc[r][i]));
                    else
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
TILE(QL_Q4_K, 1)
TILE(QL_Q4_K, 2)
TILE(QL_Q6_K, 1)
TILE(QL_Q6_K, 2)

typedef void (*tile_fn)(const float *, long long, const float *, const uint8_t *, long long, float *, long long,
                        long long, int);

void ql_blocks_mm(ql_block t, const float *x, long long ldx, const float *xs, const uint8_t *w, float *out,
                  long long ldo, long long m, long long k, long long n, int threads) {
    const long long nblk = k / BLOCK, tiles = (n + NR - 1) / NR;
    const tile_fn one = t == QL_Q8_0   ? tile_QL_Q8_0_1
                        : t == QL_Q4_0 ? tile_QL_Q4_0_1
                        : t == QL_Q4_1 ? tile_QL_Q4_1_1
                        : t == QL_Q4_K ? tile_QL_Q4_K_1
                                       : tile_QL_Q6_K_1;
    const tile_fn two = t == QL_Q8_0   ? tile_QL_Q8_0_2
                        : t == QL_Q4_0 ? tile_QL_Q4_0_2
                        : t == QL_Q4_1 ? tile_QL_Q4_1_2
                        : t == QL_Q4_K ? tile_QL_Q4_K_2
                                       : tile_QL_Q6_K_2;
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

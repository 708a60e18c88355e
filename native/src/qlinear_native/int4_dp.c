/* bfloat16 activations (any M; meant for more than a few rows) times an int4pack CPU weight with AVX512-BF16
 * dot products and no AMX; layout in int4.h.
 *
 * Why: on an AVX512-BF16 CPU without AMX tiles (Zen 4, Cooper Lake) int4_mv re-decodes the weight for
 * every two rows and the int4pack op for every row, so both fall behind a dense bfloat16 GEMM from a few
 * rows on. Here each chunk of ng channels x kc K rows is decoded once per call into bfloat16 pairs (k, k+1)
 * per channel, the operand order of VDPBF16PS, and used by every row of M: blocks of up to 6 rows x 64
 * channels of float32 accumulators (24 registers), the activation pair broadcast from memory. Partial sums
 * wait in a float32 [M, ng] scratch between K chunks; each output is rounded to bfloat16 once.
 *
 * Weight value: (q - 8) * s + o in float32 (one FMA, q - 8 exact), rounded to bfloat16 once. The decode
 * spreads the nibbles into float32 lanes 0x4B0000qq = 2^23 + q, already interleaved as (row k, row k+1) per
 * channel, so that VCVTNE2PS2BF16 yields the pair order without a further shuffle; the scales are duplicated to
 * match once per group. With VBMI one VPERMI2B forms each register of lanes; without it (Cooper Lake) two 128-bit
 * extracts, a byte unpack and VPMOVZXBD do, so everything but that decode is compiled without VBMI and the
 * kernel runs on every AVX512-BF16 CPU. Both decodes give the same bytes.
 */
#include "int4.h"
#if QL_X86
#include <stdlib.h>

#define DP_ROWS 6 /* rows per register block: 6 x 4 accumulators + 4 weight registers of 32 */

/* float32 lanes 2^23 + q for 16-channel tile half h and 8-channel half `half` of a nibble plane q (rows k at
 * bytes 0..31, k + 1 at 32..63): lane j is channel 16h + 8 half + j/2 of row k + (j & 1); the layout that
 * int4_dp_indices gives VPERMI2B, formed with AVX512-BW only. */
AVX512BF16_TARGET static inline __attribute__((always_inline)) __m512i lanes_bw(__m512i q, int h, int half,
                                                                                __m512i f23) {
    const __m128i a = h ? _mm512_extracti32x4_epi32(q, 1) : _mm512_extracti32x4_epi32(q, 0);
    const __m128i b = h ? _mm512_extracti32x4_epi32(q, 3) : _mm512_extracti32x4_epi32(q, 2);
    const __m128i ab = half ? _mm_unpackhi_epi8(a, b) : _mm_unpacklo_epi8(a, b);
    return _mm512_or_si512(_mm512_cvtepu8_epi32(ab), f23);
}

/* Decode rows [k0, k0 + kc) of channels [n0, n0 + ng) into buf: [ng/64][kc/2][64 channels x 2] bfloat16,
 * channel pairs (w[k][c], w[k+1][c]) in channel order. LANES(q, t, half): the float32 lanes 2^23 + q of tile t's
 * half (VPERMI2B with idx[h][half] from int4_dp_indices, or lanes_bw). One body, two instruction sets. */
#define DP_DECODE(NAME, TARGET, LANES)                                                                            \
    TARGET static void NAME(const uint8_t *packed, const uint16_t *sz, int64_t k, int64_t n, int64_t group,     \
                            int64_t n0, int64_t ng, int64_t k0, int64_t kc, const __m512i idx[2][2],           \
                            uint16_t *buf) {                                                                   \
        const __m512i m4 = _mm512_set1_epi8(15), f23 = _mm512_set1_epi32(0x4B000000);                          \
        const __m512 bias = _mm512_set1_ps(8388616.0f); /* 2^23 + 8: (2^23 + q) - bias = q - 8, exactly */    \
        const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);              \
        const __m512i dup_hi = _mm512_add_epi32(dup_lo, _mm512_set1_epi32(8));                                 \
        (void)idx;                                                                                             \
        for (int64_t p = 0; p < ng / 64; p++) {                                                                \
            const int64_t c0 = n0 + p * 64;                                                                    \
            const uint8_t *blk = packed + (c0 / 64) * k * 32;                                                  \
            uint16_t *dst = buf + p * (kc / 2) * 128;                                                          \
            __m512 s[4][2], o[4][2]; /* per 16-channel tile t: scale and offset for lanes (channel j/2 + 8 half) */ \
            int64_t g_loaded = -1;                                                                             \
            for (int64_t kk = k0; kk < k0 + kc; kk += 2, dst += 128) {                                         \
                const int64_t g = kk / group;                                                                  \
                if (g != g_loaded) {                                                                           \
                    prefetch_sz(sz, g + SZ_AHEAD, k / group, n, c0);                                           \
                    for (int t = 0; t < 4; t++) {                                                              \
                        __m512 st, ot;                                                                         \
                        load_sz(sz + (g * n + c0 + 16 * t) * 2, &st, &ot);                                     \
                        s[t][0] = _mm512_permutexvar_ps(dup_lo, st);                                           \
                        s[t][1] = _mm512_permutexvar_ps(dup_hi, st);                                           \
                        o[t][0] = _mm512_permutexvar_ps(dup_lo, ot);                                           \
                        o[t][1] = _mm512_permutexvar_ps(dup_hi, ot);                                           \
                    }                                                                                          \
                    g_loaded = g;                                                                              \
                }                                                                                              \
                _mm_prefetch((const char *)(blk + kk * 32 + PREFETCH), _MM_HINT_T0);                           \
                const __m512i v = _mm512_loadu_si512((const void *)(blk + kk * 32)); /* rows kk, kk + 1 */     \
                const __m512i q[2] = {_mm512_and_si512(v, m4), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)};  \
                for (int t = 0; t < 4; t++) {                                                                  \
                    __m512 f[2];                                                                               \
                    for (int half = 0; half < 2; half++) {                                                     \
                        __m512i bits = LANES;                                                                  \
                        __m512 qm8 = _mm512_sub_ps(_mm512_castsi512_ps(bits), bias);                           \
                        f[half] = _mm512_fmadd_ps(qm8, s[t][half], o[t][half]);                                \
                    }                                                                                          \
                    _mm512_store_si512((void *)(dst + t * 32), (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]));       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DP_DECODE(dp_decode_vbmi, AVX512_TARGET, _mm512_permutex2var_epi8(q[t >> 1], idx[t & 1][half], f23))
DP_DECODE(dp_decode_bw, AVX512BF16_TARGET, lanes_bw(q[t >> 1], t & 1, half, f23))

/* VPERMI2B indices: for 16-channel tile half h (channels 16h..16h+15 of a nibble plane) and half `half` of
 * it (8 channels), float32 lane j = 2^23 + q of channel 16h + 8 half + j/2 in row k + (j & 1). Bytes 64..67
 * select f23's bytes 0x00, 0x00, 0x00, 0x4B. */
static void dp_indices(__m512i idx[2][2]) {
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            uint8_t b[64];
            for (int j = 0; j < 16; j++) {
                b[4 * j] = (uint8_t)(32 * (j & 1) + 16 * h + 8 * half + j / 2);
                b[4 * j + 1] = 64;
                b[4 * j + 2] = 64;
                b[4 * j + 3] = 67;
            }
            memcpy(&idx[h][half], b, 64);
        }
}

/* c[rows, 64] (+)= x[rows, pairs * 2] @ w, w: [pairs][64 channels x 2] bfloat16 from dp_decode. */
AVX512BF16_TARGET static inline __attribute__((always_inline)) void dp_tile(const uint16_t *x, int64_t ldx,
                                                                        const uint16_t *w, int64_t pairs, float *c,
                                                                        int64_t ldc, const int rows, int first) {
    __m512 acc[DP_ROWS][4];
    for (int i = 0; i < rows; i++)
        for (int t = 0; t < 4; t++)
            acc[i][t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * t);
    for (int64_t kp = 0; kp < pairs; kp++) {
        const uint16_t *wk = w + kp * 128;
        __m512bh wt[4];
        for (int t = 0; t < 4; t++)
            wt[t] = (__m512bh)_mm512_load_si512((const void *)(wk + 32 * t));
        for (int i = 0; i < rows; i++) {
            uint32_t pair;
            memcpy(&pair, x + i * ldx + 2 * kp, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int t = 0; t < 4; t++)
                acc[i][t] = _mm512_dpbf16_ps(acc[i][t], wt[t], xb);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int t = 0; t < 4; t++)
            _mm512_storeu_ps(c + i * ldc + 16 * t, acc[i][t]);
}

/* One register block of `rows` (1..DP_ROWS) rows: a constant row count for each call site. */
AVX512BF16_TARGET static void dp_rows(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t pairs, float *c,
                                  int64_t ldc, int rows, int first) {
    switch (rows) {
    case 6: dp_tile(x, ldx, w, pairs, c, ldc, 6, first); break;
    case 5: dp_tile(x, ldx, w, pairs, c, ldc, 5, first); break;
    case 4: dp_tile(x, ldx, w, pairs, c, ldc, 4, first); break;
    case 3: dp_tile(x, ldx, w, pairs, c, ldc, 3, first); break;
    case 2: dp_tile(x, ldx, w, pairs, c, ldc, 2, first); break;
    default: dp_tile(x, ldx, w, pairs, c, ldc, 1, first); break;
    }
}

/* Output channels [n_lo, n_hi) of all m rows, in chunks of ng channels x kc K rows; buf: kc * ng bfloat16,
 * c: m * ng float32, both this thread's. */
AVX512BF16_TARGET static void dp_range(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz,
                                       uint16_t *out, int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group,
                                       int64_t ng, int64_t kc, int64_t n_lo, int64_t n_hi, const __m512i idx[2][2],
                                       int vbmi, uint16_t *buf, float *c) {
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += ng) {
        const int64_t w = n_hi - n0 < ng ? n_hi - n0 : ng;
        for (int64_t k0 = 0; k0 < k; k0 += kc) {
            const int64_t kk = k - k0 < kc ? k - k0 : kc;
            if (vbmi)
                dp_decode_vbmi(packed, sz, k, n, group, n0, w, k0, kk, idx, buf);
            else
                dp_decode_bw(packed, sz, k, n, group, n0, w, k0, kk, idx, buf);
            for (int64_t p = 0; p < w / 64; p++)
                for (int64_t i = 0; i < m; i += DP_ROWS)
                    dp_rows(x + i * ldx + k0, ldx, buf + p * (kk / 2) * 128, kk / 2, c + i * w + p * 64, w,
                            (int)(m - i < DP_ROWS ? m - i : DP_ROWS), k0 == 0);
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < w; j += 16)
                _mm256_storeu_si256((__m256i *)(out + i * ldo + n0 + j),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(c + i * w + j)));
    }
}

/* AVX512 F, BW, VL and BF16 with the OS saving ZMM state: what everything but the VBMI decode needs. */
int ql_dp_ready(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    int base = (b >> 16) & 1 && (b >> 30) & 1 && (b >> 31) & 1; /* F, BW, VL */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return base && ((a >> 5) & 1) && ql_os_avx512(); /* AVX512_BF16 */
}

/* m rows of x times the weight; group even, ng % 64 == 0, kc % 32 == 0 (checked by the binding). The output
 * channels are split over `threads` in units of ng. Returns -1 when out of memory. */
AVX512BF16_TARGET int ql_dp_mm(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz,
                               uint16_t *out, int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group, int threads,
                               int64_t ng, int64_t kc, int vbmi) {
    ng = ng < n ? ng : n;
    kc = kc < k ? kc : k;
    const int64_t units = (n + ng - 1) / ng;
    threads = ql_threads(threads, units);
    __m512i idx[2][2];
    dp_indices(idx);
    uint16_t *buf = aligned_alloc(64, (size_t)(threads * kc * ng * 2));
    float *c = aligned_alloc(64, (size_t)(threads * m * ng * 4));
    const int ok = buf && c;
    if (ok) {
#pragma omp parallel num_threads(threads)
        {
            int64_t lo, hi;
            ql_thread_share(units, &lo, &hi);
            const int64_t t = QL_THREAD;
            dp_range(x, ldx, packed, sz, out, ldo, m, k, n, group, ng, kc, lo * ng, hi * ng < n ? hi * ng : n, idx,
                     vbmi, buf + t * kc * ng, c + t * m * ng);
        }
    }
    free(buf);
    free(c);
    return ok ? 0 : -1;
}
#else
int ql_dp_ready(void) { return 0; }
#endif

/* bfloat16 activations times an int4pack CPU weight on AMX tiles (TDPBF16PS); layout in int4.h.
 *
 * Why: the int4pack op re-decodes the weight for every row of M, and decode-to-memory + a bf16 GEMM pays for
 * writing and re-reading a dense tile. Here the weight is decoded once per call, straight into the VNNI pair
 * order of AMX's B operand (16 k-pairs x 16 channels per 1 KiB tile), held in L1/L2 and used by every 16-row
 * block of activations. Two kernels:
 *   ql_amx_mm_codes (group % 32 == 0; fastest up to a few dozen rows): the tiles hold the exact codes as
 *     bfloat16 128 + q and each group's float32 product is scaled after: y += s * C_g + rowsum_g(x) * (o - 136 s).
 *   ql_amx_mm_weights (any even group; large M): the tiles hold bf16(fma(q, s, o - 8 s)), the weight rounded
 *     to bfloat16 once, and chunks of ng channels x kc rows are reused across all of M.
 * AMX needs the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM), asked once, by the
 * first ql_amx_ready().
 */
#include "int4.h"
#if QL_X86
#include <stdlib.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma")))

/* The AVX-512 these kernels use beside the tiles: F, BW, VBMI and BF16, with the OS saving the state. */
static int amx_avx512(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    int avx512 = (b >> 16) & 1 && (b >> 30) & 1 && (c >> 1) & 1; /* AVX512F, AVX512BW, AVX512_VBMI */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return avx512 && ((a >> 5) & 1) && ql_os_avx512(); /* AVX512_BF16 */
}

static int amx_state = -1; /* -1 unknown, 0 no, 1 yes */

int ql_amx_ready(void) { return ql_amx_ready_once(&amx_state, amx_avx512); }

/* Decode rows [k0, k0 + kc) of output channels [n0, n0 + ng) into buf: [kc/32][ng/16] tiles of [16][32] bf16,
 * tile row r holding the k-pair (2r, 2r+1) interleaved per channel. */
AMX_TARGET static void decode_chunk(const uint8_t *packed, const uint16_t *sz,
                                    int64_t k, int64_t n, int64_t group, int64_t n0, int64_t ng, int64_t k0,
                                    int64_t kc, uint16_t *buf) {
    const int64_t nt = ng / 16;
    const __m256i nib = _mm256_set1_epi8(15);
    const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                          21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < ng / 64; p++) {
        const int64_t c0 = n0 + p * 64;
        const uint8_t *blk = packed + (c0 / 64) * k * 32;
        __m512 s[4] = {0}, o[4] = {0};
        int64_t g_loaded = -1;
        for (int64_t kk = k0; kk < k0 + kc; kk += 2) {
            int64_t g = kk / group;
            if (g != g_loaded) { /* scale and o = offset - 8 s for these 64 channels */
                prefetch_sz(sz, g + SZ_AHEAD, k / group, n, c0);
                for (int t = 0; t < 4; t++) {
                    __m512 off;
                    load_sz(sz + (g * n + c0 + 16 * t) * 2, &s[t], &off);
                    o[t] = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s[t], off);
                }
                g_loaded = g;
            }
            _mm_prefetch((const char *)(blk + kk * 32 + PREFETCH), _MM_HINT_T0);
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(blk + kk * 32));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(blk + (kk + 1) * 32));
            __m256i q0[2] = {_mm256_and_si256(v0, nib), _mm256_and_si256(_mm256_srli_epi16(v0, 4), nib)};
            __m256i q1[2] = {_mm256_and_si256(v1, nib), _mm256_and_si256(_mm256_srli_epi16(v1, 4), nib)};
            const int64_t ks = (kk - k0) / 32, r = ((kk - k0) % 32) / 2;
            uint16_t *row = buf + ((ks * nt + p * 4) * 16 + r) * 32;
            for (int t = 0; t < 4; t++) {
                __m128i a = t & 1 ? _mm256_extracti128_si256(q0[t >> 1], 1) : _mm256_castsi256_si128(q0[t >> 1]);
                __m128i b = t & 1 ? _mm256_extracti128_si256(q1[t >> 1], 1) : _mm256_castsi256_si128(q1[t >> 1]);
                __m512 fa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a)), s[t], o[t]);
                __m512 fb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), s[t], o[t]);
                __m512i ab = _mm512_permutexvar_epi16(pair, (__m512i)_mm512_cvtne2ps_pbh(fb, fa));
                _mm512_store_si512((void *)(row + t * 16 * 32), ab);
            }
        }
    }
}

/* x [m, k] (row pitch ldx) -> tiles [m/16][k/32][16][32]: each A tile contiguous (a pitch of 64 bytes), so its
 * 16 rows do not share one L1 set as rows 2*k bytes apart would. */
AMX_TARGET static void pack_a(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, uint16_t *a) {
    for (int64_t mb = 0; mb < (m + 15) / 16; mb++)
        for (int64_t ks = 0; ks < k / 32; ks++)
            for (int64_t r = 0; r < 16; r++) {
                const int64_t i = mb * 16 + r;
                _mm512_store_si512((void *)(a + ((mb * (k / 32) + ks) * 16 + r) * 32),
                                   i < m ? _mm512_loadu_si512((const void *)(x + i * ldx + ks * 32))
                                         : _mm512_setzero_si512());
            }
}

AMX_TARGET static void config_tiles(void) { ql_load_tiles((const uint16_t[8]){64, 64, 64, 64, 64, 64, 64, 64}); }

/* C[32 rows, 32 channels] += A x B over one chunk: four 16x16 float32 tiles, two A and two B tiles. */
AMX_TARGET static void block_2x2(const uint16_t *a0, const uint16_t *a1, const uint16_t *b0, const uint16_t *b1,
                                 int64_t steps, int64_t b_step, float *c, int64_t ldc, int first) {
    if (first) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    } else {
        _tile_loadd(0, c, ldc * 4); _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 16 * ldc, ldc * 4); _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    }
    for (int64_t ks = 0; ks < steps; ks++) {
        _tile_loadd(4, a0 + ks * 512, 64);
        _tile_loadd(5, a1 + ks * 512, 64);
        _tile_loadd(6, b0 + ks * b_step, 64);
        _tile_loadd(7, b1 + ks * b_step, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, ldc * 4); _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4); _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

/* C[16 rows, 64 channels] (+)= A x B over `steps` k-steps: four float32 tiles, one A tile, B tiles alternating. */
AMX_TARGET static void block_1x4(const uint16_t *a, const uint16_t *b, int64_t steps, int64_t b_step, float *c,
                                 int64_t ldc, int first) {
    if (first) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    } else {
        _tile_loadd(0, c, ldc * 4); _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 32, ldc * 4); _tile_loadd(3, c + 48, ldc * 4);
    }
    for (int64_t ks = 0; ks < steps; ks++) {
        const uint16_t *bk = b + ks * b_step;
        _tile_loadd(4, a + ks * 512, 64);
        _tile_loadd(5, bk, 64); _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, bk + 512, 64); _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, bk + 1024, 64); _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, bk + 1536, 64); _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, c, ldc * 4); _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 32, ldc * 4); _tile_stored(3, c + 48, ldc * 4);
}

/* float32 [m, ng] scratch -> bfloat16 out[:, n0:n0+ng] (round to nearest even). */
AMX_TARGET static void store_bf16(const float *c, int64_t m, int64_t ng, uint16_t *out, int64_t ldo) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ng; j += 16)
            _mm256_storeu_si256((__m256i *)(out + i * ldo + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(c + i * ng + j)));
}

/* Large M: weight chunks decoded with their scales (decode_chunk), reused by every 16- or 32-row block. */
AMX_TARGET static void mm_weights(const uint16_t *a, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                                   int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group, int64_t ng, int64_t kc,
                                   int64_t n_lo, int64_t n_hi, uint16_t *buf, float *c) {
    const int64_t a_block = (k / 32) * 512, mp = (m + 15) / 16 * 16;
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += ng) {
        const int64_t w = n - n0 < ng ? n - n0 : ng, nt = w / 16;
        for (int64_t k0 = 0; k0 < k; k0 += kc) {
            const int64_t kk = k - k0 < kc ? k - k0 : kc, steps = kk / 32;
            const uint16_t *ak = a + (k0 / 32) * 512;
            decode_chunk(packed, sz, k, n, group, n0, w, k0, kk, buf);
            int64_t mb = 0;
            for (; mb + 2 <= mp / 16; mb += 2)
                for (int64_t t = 0; t < nt; t += 2)
                    block_2x2(ak + mb * a_block, ak + (mb + 1) * a_block, buf + t * 512, buf + (t + 1) * 512, steps,
                              nt * 512, c + mb * 16 * w + t * 16, w, k0 == 0);
            for (; mb < mp / 16; mb++)
                for (int64_t t = 0; t < nt; t += 4)
                    block_1x4(ak + mb * a_block, buf + t * 512, steps, nt * 512, c + mb * 16 * w + t * 16, w, k0 == 0);
        }
        store_bf16(c, m, w, out + n0, ldo);
    }
}

/* Rows k, k+1 of one 64-channel block -> four B tile rows of bf16 (128 + q) pairs: exact, no scale. */
AMX_TARGET static inline void decode_raw_pair(const uint8_t *r0, const uint8_t *r1, uint16_t *row) {
    const __m256i nib = _mm256_set1_epi8(15);
    const __m512i bias = _mm512_set1_epi16(0x4300); /* bf16 128.0; | q gives 128 + q exactly */
    __m256i v0 = _mm256_loadu_si256((const __m256i *)r0), v1 = _mm256_loadu_si256((const __m256i *)r1);
    __m256i q0[2] = {_mm256_and_si256(v0, nib), _mm256_and_si256(_mm256_srli_epi16(v0, 4), nib)};
    __m256i q1[2] = {_mm256_and_si256(v1, nib), _mm256_and_si256(_mm256_srli_epi16(v1, 4), nib)};
    for (int h = 0; h < 2; h++) { /* h = 0: channels 0..31 (low nibbles), 1: 32..63 */
        __m256i lo = _mm256_unpacklo_epi8(q0[h], q1[h]), hi = _mm256_unpackhi_epi8(q0[h], q1[h]);
        __m256i t0 = _mm256_permute2x128_si256(lo, hi, 0x20), t1 = _mm256_permute2x128_si256(lo, hi, 0x31);
        _mm512_store_si512((void *)(row + (2 * h) * 512), _mm512_or_si512(_mm512_cvtepu8_epi16(t0), bias));
        _mm512_store_si512((void *)(row + (2 * h + 1) * 512), _mm512_or_si512(_mm512_cvtepu8_epi16(t1), bias));
    }
}

/* Small M (group % 32 == 0): per group, codes go in exact as bf16 (128 + q) pairs and the float32 tiles are
 * scaled after: y += s * C_g + rowsum_g(x) * (offset - 136 s). The decode is a few integer operations per 32
 * weights, done once per group and used by every 16-row block; only the first m rows are scaled. */
AMX_TARGET static void mm_codes(const uint16_t *a, const float *rs, const uint8_t *packed, const uint16_t *sz,
                                uint16_t *out, int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group,
                                int64_t n_lo, int64_t n_hi, uint16_t *buf, float *cg, float *acc) {
    const int64_t ng = k / group, gsteps = group / 32, a_block = (k / 32) * 512;
    for (int64_t c0 = n_lo; c0 < n_hi; c0 += 64) {
        const uint8_t *blk = packed + (c0 / 64) * k * 32;
        memset(acc, 0, (size_t)(m * 64 * 4));
        for (int64_t g = 0; g < ng; g++) {
            prefetch_sz(sz, g + SZ_AHEAD, ng, n, c0);
            for (int64_t kk = g * group; kk < (g + 1) * group; kk += 2) {
                const int64_t ks = (kk - g * group) / 32, r = (kk % 32) / 2;
                _mm_prefetch((const char *)(blk + kk * 32 + PREFETCH), _MM_HINT_T0);
                decode_raw_pair(blk + kk * 32, blk + (kk + 1) * 32, buf + (ks * 4 * 16 + r) * 32);
            }
            __m512 s[4], o[4];
            for (int t = 0; t < 4; t++) {
                __m512 off;
                load_sz(sz + (g * n + c0 + 16 * t) * 2, &s[t], &off);
                o[t] = _mm512_fnmadd_ps(_mm512_set1_ps(136.0f), s[t], off);
            }
            for (int64_t mb = 0; mb * 16 < m; mb++) {
                block_1x4(a + mb * a_block + g * gsteps * 512, buf, gsteps, 4 * 512, cg, 64, 1);
                const int64_t rows = m - mb * 16 < 16 ? m - mb * 16 : 16;
                for (int64_t i = 0; i < rows; i++) {
                    const int64_t row = mb * 16 + i;
                    const __m512 r = _mm512_set1_ps(rs[row * ng + g]);
                    for (int t = 0; t < 4; t++) {
                        float *ai = acc + row * 64 + 16 * t;
                        __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(cg + i * 64 + 16 * t), s[t], _mm512_loadu_ps(ai));
                        _mm512_storeu_ps(ai, _mm512_fmadd_ps(r, o[t], v));
                    }
                }
            }
        }
        store_bf16(acc, m, 64, out + c0, ldo);
    }
}

AMX_TARGET int ql_amx_mm_weights(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz,
                                 uint16_t *out, int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group,
                                 int threads, int64_t ng, int64_t kc) {
    ng = ng < n ? ng : n;
    kc = kc < k ? kc : k;
    const int64_t mp = (m + 15) / 16 * 16, units = (n + ng - 1) / ng;
    threads = ql_threads(threads, units);
    uint16_t *a = aligned_alloc(64, (size_t)(mp * k * 2)), *buf = aligned_alloc(64, (size_t)(threads * kc * ng * 2));
    float *c = aligned_alloc(64, (size_t)(threads * mp * ng * 4));
    int ok = a && buf && c;
    if (ok) {
        pack_a(x, ldx, m, k, a);
#pragma omp parallel num_threads(threads)
        {
            int64_t lo, hi;
            ql_thread_share(units, &lo, &hi);
            const int64_t t = QL_THREAD;
            config_tiles();
            mm_weights(a, packed, sz, out, ldo, m, k, n, group, ng, kc, lo * ng, hi * ng < n ? hi * ng : n,
                       buf + t * kc * ng, c + t * mp * ng);
            _tile_release();
        }
    }
    free(a);
    free(buf);
    free(c);
    return ok ? 0 : -1;
}

AMX_TARGET int ql_amx_mm_codes(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz,
                               uint16_t *out, int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group,
                               int threads) {
    const int64_t mp = (m + 15) / 16 * 16, units = n / 64;
    threads = ql_threads(threads, units);
    uint16_t *a = aligned_alloc(64, (size_t)(mp * k * 2)), *buf = aligned_alloc(64, (size_t)(threads * group * 64 * 2));
    float *rs = malloc((size_t)(m * (k / group) * 4)), *cg = aligned_alloc(64, (size_t)(threads * 16 * 64 * 4)),
          *acc = aligned_alloc(64, (size_t)(threads * mp * 64 * 4));
    int ok = a && buf && rs && cg && acc;
    if (ok) {
        pack_a(x, ldx, m, k, a);
        row_sums(x, ldx, m, k, group, rs);
#pragma omp parallel num_threads(threads)
        {
            int64_t lo, hi;
            ql_thread_share(units, &lo, &hi);
            const int64_t t = QL_THREAD;
            config_tiles();
            mm_codes(a, rs, packed, sz, out, ldo, m, k, n, group, lo * 64, hi * 64, buf + t * group * 64,
                     cg + t * 16 * 64, acc + t * mp * 64);
            _tile_release();
        }
    }
    free(a);
    free(buf);
    free(rs);
    free(cg);
    free(acc);
    return ok ? 0 : -1;
}
#else
int ql_amx_ready(void) { return 0; }
#endif

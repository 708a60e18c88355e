/* bfloat16 activations (one or two rows) times an int4pack CPU weight with AVX512-BF16; layout in int4.h.
 *
 * Why: at M = 1 the AMX tiles would be 15/16 empty, and the int4pack op runs below the memory bandwidth.
 * Here one 64-byte load holds rows k and k+1 of a 64-channel block; VPERMI2B turns its nibbles straight
 * into bfloat16 pairs (128 + q_k, 128 + q_k+1) per channel (the byte 0x43 of bf16 128.0 comes from a
 * constant register), VDPBF16PS multiplies them by the activation pair, exactly, into float32; each group is
 * then scaled: y += s * acc_g + sum_g(x) * (o - 136 s). The weight stream is prefetched (int4.h).
 */
#include "int4.h"
#if QL_X86
#include <stdlib.h>

/* What int4_mm_dp needs (ql_dp_ready: AVX512 F, BW, VL, BF16, OS support) plus VBMI. */
int ql_mv_ready(void) {
    unsigned a, b, c, d;
    return ql_dp_ready() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 1) & 1;
}

/* rows (1 or 2) of x times one 64-channel block, written to out[:, c0:c0+64]; rs: the rows' per-group sums. */
AVX512_TARGET static inline void mv_block(const uint16_t *x, int64_t ldx, const float *rs, const uint8_t *blk,
                                          const uint16_t *sz, uint16_t *out, int64_t ldo, int rows, int64_t k,
                                          int64_t n, int64_t group, int64_t c0, __m512i idx0, __m512i idx1) {
    const __m512i c43 = _mm512_set1_epi8(0x43), m4 = _mm512_set1_epi8(15);
    __m512 tot[2][4];
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 4; t++)
            tot[i][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k / group; g++) {
        prefetch_sz(sz, g + SZ_AHEAD, k / group, n, c0);
        __m512 acc[2][4];
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < 4; t++)
                acc[i][t] = _mm512_setzero_ps();
        for (int64_t kk = g * group; kk < (g + 1) * group; kk += 2) {
            _mm_prefetch((const char *)(blk + kk * 32 + PREFETCH), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512((const void *)(blk + kk * 32));
            __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            __m512bh w[4] = {(__m512bh)_mm512_permutex2var_epi8(lo, idx0, c43),
                             (__m512bh)_mm512_permutex2var_epi8(lo, idx1, c43),
                             (__m512bh)_mm512_permutex2var_epi8(hi, idx0, c43),
                             (__m512bh)_mm512_permutex2var_epi8(hi, idx1, c43)};
            for (int i = 0; i < rows; i++) {
                uint32_t pair;
                memcpy(&pair, x + i * ldx + kk, 4);
                __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pair);
                for (int t = 0; t < 4; t++)
                    acc[i][t] = _mm512_dpbf16_ps(acc[i][t], w[t], xb);
            }
        }
        __m512 r[2];
        for (int i = 0; i < rows; i++)
            r[i] = _mm512_set1_ps(rs[i * (k / group) + g]);
        for (int t = 0; t < 4; t++) {
            __m512 s, off;
            load_sz(sz + (g * n + c0 + 16 * t) * 2, &s, &off);
            __m512 o = _mm512_fnmadd_ps(_mm512_set1_ps(136.0f), s, off);
            for (int i = 0; i < rows; i++)
                tot[i][t] = _mm512_fmadd_ps(r[i], o, _mm512_fmadd_ps(acc[i][t], s, tot[i][t]));
        }
    }
    for (int i = 0; i < rows; i++)
        for (int t = 0; t < 4; t++)
            _mm256_storeu_si256((__m256i *)(out + i * ldo + c0 + 16 * t), (__m256i)_mm512_cvtneps_pbh(tot[i][t]));
}

/* m rows (any m; two at a time) of x times the weight; group % 16 == 0. Returns -1 when out of memory. */
AVX512_TARGET int ql_mv(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                        int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group, int threads) {
    uint8_t ib[2][64]; /* byte 4c = q_k[c], 4c+1 = 0x43 (index 64: the constant), 4c+2 = q_k+1[c], 4c+3 = 0x43 */
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < 16; c++) {
            ib[h][4 * c] = (uint8_t)(16 * h + c);
            ib[h][4 * c + 1] = 64;
            ib[h][4 * c + 2] = (uint8_t)(32 + 16 * h + c);
            ib[h][4 * c + 3] = 64;
        }
    const __m512i idx0 = _mm512_loadu_si512(ib[0]), idx1 = _mm512_loadu_si512(ib[1]);
    const int64_t ng = k / group;
    float *rs = malloc((size_t)(m * ng) * sizeof(float));
    if (!rs)
        return -1;
    row_sums(x, ldx, m, k, group, rs);
    const int64_t units = n / 64;
    threads = ql_threads(threads, units);
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        for (int64_t i = 0; i < m; i += 2)
            for (int64_t c0 = lo * 64; c0 < hi * 64; c0 += 64) {
                const uint8_t *blk = packed + (c0 / 64) * k * 32;
                const float *ri = rs + i * ng;
                if (m - i >= 2)
                    mv_block(x + i * ldx, ldx, ri, blk, sz, out + i * ldo, ldo, 2, k, n, group, c0, idx0, idx1);
                else
                    mv_block(x + i * ldx, ldx, ri, blk, sz, out + i * ldo, ldo, 1, k, n, group, c0, idx0, idx1);
            }
    }
    free(rs);
    return 0;
}
#else
int ql_mv_ready(void) { return 0; }
#endif

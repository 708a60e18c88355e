/* Shared pieces of qlinear's native int4 kernels (int4_amx.c, int4_mv.c, int4_dp.c, _int4.c).
 *
 * Weight: torch's int4pack CPU bytes (_convert_weight_to_int4pack_for_cpu, AVX512 builds): blocks of 64
 * output channels, each [K][32] bytes; byte j holds channel j in its low nibble and channel j + 32 in its
 * high one. Value, as the int4pack op means it: s * (q - 8) + o, with (s, o) the op's bfloat16
 * scales_and_zeros [K/group, N, 2]. Activations and outputs are bfloat16 [M, ld]; products accumulate in
 * float32 and each output is rounded to bfloat16 once. Callers pad K to a multiple of 32, N to 64. Each kernel
 * splits the output channels over `threads` OpenMP threads (the caller passes torch's thread count).
 */
#ifndef QLINEAR_INT4_H
#define QLINEAR_INT4_H
#include "cpu_common.h"

#if QL_X86
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma")))
/* The same without VBMI: code that must also run on AVX512-BF16 CPUs that lack it (Cooper Lake). */
#define AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

/* Scales and offsets of 16 channels from the op's interleaved [.., 2] bfloat16 pairs, as float32. */
AVX512BF16_TARGET static inline void load_sz(const uint16_t *sz, __m512 *s, __m512 *off) {
    __m512i u = _mm512_loadu_si512((const void *)sz); /* lane j: scale j (low half) | offset j << 16 */
    *s = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    *off = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* Bytes ahead in a block's weight stream that the kernels prefetch; measured best of 32..256 rows of a block
 * on 4096x14336 (int4_mv), and needed by the AMX kernels on weights larger than the caches. */
#define PREFETCH (256 * 32)

/* Groups ahead whose scales are prefetched: a group's scales for 64 channels are 4 cache lines, N * 4 bytes
 * away from the previous group's, a stride the hardware prefetchers do not follow (small groups on large
 * layers waited on every group: 8192x14336 g32 at M=1 took 11.6 ms in int4_mm_codes against 6.5 for the op). */
#define SZ_AHEAD 4

/* Prefetch the scales/offsets of group g, channels c0..c0+63, if g is a group of the weight. */
static inline void prefetch_sz(const uint16_t *sz, int64_t g, int64_t groups, int64_t n, int64_t c0) {
    if (g < groups)
        for (int i = 0; i < 4; i++)
            _mm_prefetch((const char *)(sz + (g * n + c0) * 2 + i * 32), _MM_HINT_T0);
}

/* Sum of n bfloat16 values (n % 16 == 0) in float32. */
AVX512_TARGET static inline float sum_bf16(const uint16_t *x, int64_t n) {
    __m512 t = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16)
        t = _mm512_add_ps(t, _mm512_castsi512_ps(
                                 _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + j))), 16)));
    return _mm512_reduce_add_ps(t);
}

/* Per-group sums of x's m rows, float32 [m][k/group] (the zero-offset term of the exact-code kernels). */
AVX512_TARGET static inline void row_sums(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, int64_t group,
                                          float *rs) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < k / group; g++)
            rs[i * (k / group) + g] = sum_bf16(x + i * ldx + g * group, group);
}

/* AMX-BF16 kernels (int4_amx.c). */
int ql_amx_mm_codes(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                    int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group, int threads);
int ql_amx_mm_weights(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                      int64_t ldo, int64_t m, int64_t k, int64_t n, int64_t group, int threads, int64_t ng,
                      int64_t kc);
/* AVX512-BF16 GEMV for one or two rows (int4_mv.c). */
int ql_mv(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz, uint16_t *out, int64_t ldo,
          int64_t m, int64_t k, int64_t n, int64_t group, int threads);
/* AVX512-BF16 GEMM without AMX, the weight decoded once per call in ng x kc chunks (int4_dp.c); runs where
 * ql_dp_ready(). vbmi: decode with VPERMI2B (only where ql_mv_ready()), else with AVX512-BW unpacks. */
int ql_dp_mm(const uint16_t *x, int64_t ldx, const uint8_t *packed, const uint16_t *sz, uint16_t *out, int64_t ldo,
             int64_t m, int64_t k, int64_t n, int64_t group, int threads, int64_t ng, int64_t kc, int vbmi);
#endif

/* 1 when this CPU and the OS let the kernels run; 0 elsewhere, including non-x86 builds. */
int ql_amx_ready(void);
int ql_mv_ready(void);
int ql_dp_ready(void);
#endif

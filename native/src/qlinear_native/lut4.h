/* Shared pieces of qlinear's native 4-bit look-up-table weight kernels (bitsandbytes NF4 / FP4; lut4_mv.c,
 * lut4_mm.c, _lut4.c).
 *
 * y[M, N] = x[M, K] @ W^T with W[n, k] = table[c(n, k)] * absmax[n, k / block], W never materialized:
 *   codes uint8 [N, K/2]: byte j of row n holds c(n, 2j) in its HIGH nibble and c(n, 2j + 1) in its LOW one
 *     (bitsandbytes' order), absmax float32 [N, K/block], table float32 [16] (NF4, FP4 or any other);
 *   x bfloat16 or float32 [M, ldx]; y the same dtype [M, ldo] (bfloat16: rounded once, to nearest even).
 * Every weight is the float32 product fl(table[c] * absmax) (the kernels multiply the table by each block's
 * absmax, in float32, and look the codes up in the product), exactly the float32 weight that bitsandbytes'
 * dequantization computes before casting. The AVX-512 kernel forms each product x * w as a float32 FMA; the AMX
 * kernel splits w exactly into three bfloat16 terms (w = hi + mid + lo, see lut4_mm.c) whose products with a
 * bfloat16 x are exact. Sums are float32, per output in a fixed order that does not depend on the thread count.
 * Requirements (checked by _lut4.c): block % 32 == 0, K % block == 0, any N >= 1, ldx >= K, ldo >= N, no
 * alignment. Output channels are split over `threads` OpenMP threads.
 */
#ifndef QLINEAR_LUT4_H
#define QLINEAR_LUT4_H
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#define Q4_X86 1
#else
#define Q4_X86 0
#endif

#ifdef _OPENMP
#include <omp.h>
#define Q4_THREAD omp_get_thread_num()
#define Q4_THREADS omp_get_num_threads()
#else
#define Q4_THREAD 0
#define Q4_THREADS 1
#endif

/* One call's arguments. */
typedef struct {
    const void *x; /* bfloat16 (uint16_t) or float32, [M, ldx] */
    const uint8_t *codes;
    const float *absmax;
    const float *table;
    void *out; /* x's dtype, [M, ldo] */
    int64_t m, k, n, block, ldx, ldo;
    int x_f32, threads;
} q4_call;

/* This thread's share [*lo, *hi) of `units` equal work units (inside a parallel region, or all of them). */
static inline void q4_share(int64_t units, int64_t *lo, int64_t *hi) {
    const int64_t t = Q4_THREAD, nt = Q4_THREADS;
    *lo = units * t / nt;
    *hi = units * (t + 1) / nt;
}

/* float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN), as torch rounds. */
static inline uint16_t q4_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

/* Store y into out[i, j] in x's dtype. */
static inline void q4_put(const q4_call *c, int64_t i, int64_t j, float y) {
    if (c->x_f32)
        ((float *)c->out)[i * c->ldo + j] = y;
    else
        ((uint16_t *)c->out)[i * c->ldo + j] = q4_bf16(y);
}

/* 1 when this CPU and OS run the kernels; 0 elsewhere, including non-x86 builds. */
int q4_mv_ready(void);
int q4_amx_ready(void);
#if Q4_X86
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
/* Does the OS save the AVX-512 state (XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM)? A CPU flag alone is not
 * enough: a hypervisor can hide the state, and the first 512-bit instruction would then fault. */
static inline int q4_os_avx512(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) /* OSXSAVE */
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0xE6) == 0xE6;
}

/* AVX-512 float32 kernel, any M (lut4_mv.c); AMX-BF16 kernel, bfloat16 x (lut4_mm.c). 0, or -1 when out of
 * memory. */
int q4_mv(const q4_call *c);
int q4_mm(const q4_call *c);
#endif
#endif

/* Shared pieces of qlinear's native float-quantized weight kernels (float8_mv.c, float8_amx.c, _float.c).
 *
 * y[M, N] = x[M, K] @ W^T, x bfloat16 (row pitch ldx), y float32 or bfloat16 (row pitch ldo), W never
 * materialized:
 *   FP8: w8 uint8 [N, K] raw float8 bytes (e4m3fn: 1-4-3, bias 7, max 448, 0x7F/0xFF NaN, no inf; e5m2: 1-5-2,
 *        bias 15, inf and NaN), scale float32 [N, ceil(K/bk)]: W[n, k] = fp8(w8[n, k]) * scale[n, k / bk].
 *   FP4: packed uint8 [N, K/2] (column 2j in byte j's low nibble, 2j+1 in its high nibble), each nibble E2M1
 *        (bit 3 sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6); block scales uint8 [N, K/bs]: NVFP4 bs = 16,
 *        float8 e4m3fn bytes; MXFP4 bs = 32, E8M0 bytes (2**(e - 127), 255 = NaN); y = g * sum_k x W.
 * Every product is exact: each e4m3/e5m2 value, subnormals included, is a normal bfloat16 (the decode tables
 * hold those bfloat16 values, so no instruction ever sees a denormal weight, whatever MXCSR.DAZ says), and an
 * E2M1 code times an e4m3 or in-range power-of-two scale is a normal bfloat16 too. Products are formed in
 * float32 (8-bit by 8-bit significands: exact) or by AMX TDPBF16PS (exact products), and summed in float32.
 * Output channels are split over `threads` OpenMP threads; each output is summed by one thread in a fixed
 * order, so results do not depend on the thread count.
 * Requirements (checked by _float.c): K % 32 == 0 (every format; bk = K with K % 32 != 0 is refused), bk % 32 ==
 * 0 or bk >= K (one block; the last block may be partial: ceil(K/bk) scales), any N >= 1, ldx >= K, ldo >= N,
 * no alignment. Edge cases: bfloat16 activations below 2**-126 (denormals) are used by the AVX-512 kernels and
 * read as zero by the AMX ones; an E8M0 scale of 0 (2**-127) is a float32 denormal in the AVX-512 kernels, so it
 * reads as zero if the caller set MXCSR.DAZ (torch.set_flush_denormal(True)).
 */
#ifndef QLINEAR_FLOAT8_H
#define QLINEAR_FLOAT8_H
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#define QF_X86 1
#else
#define QF_X86 0
#endif

#ifdef _OPENMP
#include <omp.h>
#define QF_THREAD omp_get_thread_num()
#define QF_THREADS omp_get_num_threads()
#else
#define QF_THREAD 0
#define QF_THREADS 1
#endif

typedef enum { QF_E4M3 = 0, QF_E5M2 = 1 } qf_fp8;
typedef enum { QF_NVFP4 = 0, QF_MXFP4 = 1 } qf_fp4;

/* One call's arguments. fp8: w = w8, scale = float32 [N, ceil(K/bk)], blk = bk. fp4: w = packed, scale = the
 * block-scale bytes [N, K/bs], blk = bs (16 or 32), g the global multiplier. */
typedef struct {
    const uint16_t *x;
    const uint8_t *w;
    const void *scale;
    void *out;
    int64_t ldx, ldo, m, k, n, blk;
    int fmt, out_bf16, threads;
    float g;
} qf_call;

/* This thread's share [*lo, *hi) of `units` equal work units (inside a parallel region, or all of them). */
static inline void qf_share(int64_t units, int64_t *lo, int64_t *hi) {
    const int64_t t = QF_THREAD, nt = QF_THREADS;
    *lo = units * t / nt;
    *hi = units * (t + 1) / nt;
}

/* float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN), as torch rounds. */
static inline uint16_t qf_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

/* Store y into out[i, j] (float32 or bfloat16 by c->out_bf16). */
static inline void qf_put(const qf_call *c, int64_t i, int64_t j, float y) {
    if (c->out_bf16)
        ((uint16_t *)c->out)[i * c->ldo + j] = qf_bf16(y);
    else
        ((float *)c->out)[i * c->ldo + j] = y;
}

/* Decode tables, filled once by qf_init() (module init) from the format definitions:
 * qf_fp8_lo/hi[f][c]: low and high byte of the bfloat16 value of float8 magnitude c (0..127) of format f (every
 * value, subnormals included, is a normal bfloat16; e4m3fn 127 and e5m2 NaN codes give NaN, e5m2 124 inf);
 * qf_e2m1[q]: float32 value of E2M1 code q; qf_nv_tab/qf_mx_tab[s][q]: bfloat16 of code q times scale byte s
 * (exact for every NVFP4 scale; for MXFP4 when 2 <= s <= 252, see qf_mx_exact). */
extern uint8_t qf_fp8_lo[2][128], qf_fp8_hi[2][128];
extern float qf_e2m1[16];
extern uint16_t qf_nv_tab[256][16], qf_mx_tab[256][16];
void qf_init(void);
/* E8M0 bytes whose table row is exact: every E2M1 magnitude times 2**(s - 127) a normal, finite bfloat16. */
static inline int qf_mx_exact(unsigned s) { return s >= 2 && s <= 252; }

int qf_mv_ready(void);
int qf_amx_ready(void);
#if QF_X86
#define QF_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma")))
/* Does the OS save the AVX-512 state (XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM)? */
static inline int qf_os_avx512(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) /* OSXSAVE */
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0xE6) == 0xE6;
}

/* AVX-512 kernels, any M (float8_mv.c); 0, or -1 when out of memory. The _range forms compute output
 * channels [n_lo, n_hi) on the calling thread only. */
int qf_fp8_mv(const qf_call *c);
int qf_fp4_mv(const qf_call *c);
int qf_fp4_mv_range(const qf_call *c, int64_t n_lo, int64_t n_hi);
/* AMX-BF16 kernels (float8_amx.c). */
int qf_fp8_amx(const qf_call *c);
int qf_fp4_amx(const qf_call *c);
#endif
#endif

/* Small CPU helpers shared by qlinear's native kernels (int4, float8, lut4, blocks), kept in one place so that
 * every extension rounds, splits work and detects the CPU in the same way. Each extension keeps its own
 * instruction-set requirements (its *_ready functions); only the common steps are here.
 */
#ifndef QLINEAR_CPU_COMMON_H
#define QLINEAR_CPU_COMMON_H
#include <stdint.h>
#include <string.h>

/* The kernels use x86-64 intrinsics, and AMX needs Linux's arch_prctl to grant tile data, so they are built
 * only where both hold (QL_X86); the AVX-512 state check below only needs x86-64 (the GGUF block kernel). */
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#define QL_X86 1
#else
#define QL_X86 0
#endif

/* OpenMP thread number and count, or one thread in a build without OpenMP. */
#ifdef _OPENMP
#include <omp.h>
#define QL_THREAD omp_get_thread_num()
#define QL_THREADS omp_get_num_threads()
#else
#define QL_THREAD 0
#define QL_THREADS 1
#endif

/* Threads to start for `units` equal work units: the caller's count, at least 1 and at most one per unit (a
 * further thread would get no work, only its scratch buffers). */
static inline int ql_threads(int threads, int64_t units) {
    return threads < 1 ? 1 : threads > units ? (int)units : threads;
}

/* This thread's share [*lo, *hi) of `units` equal work units (inside a parallel region, or all of them): a
 * fixed split by thread number, so each output is computed by one thread in a fixed order. */
static inline void ql_thread_share(int64_t units, int64_t *lo, int64_t *hi) {
    const int64_t t = QL_THREAD, nt = QL_THREADS;
    *lo = units * t / nt;
    *hi = units * (t + 1) / nt;
}

/* float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN), as torch rounds. */
static inline uint16_t ql_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

#if defined(__x86_64__)
/* Does the OS save the AVX-512 state (XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM)? A CPU flag alone is not
 * enough: a hypervisor can hide the state, and the first 512-bit instruction would then fault. */
static inline int ql_os_avx512(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) /* OSXSAVE */
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0xE6) == 0xE6;
}
#endif

#if QL_X86
#include <sys/syscall.h>
#include <unistd.h>

#define QL_ARCH_REQ_XCOMP_PERM 0x1023
#define QL_XFEATURE_XTILEDATA 18

/* AMX-BF16 readiness, asked once per process and cached in *state (-1 unknown, 0 no, 1 yes): the caller's own
 * AVX-512 requirement (`avx512`, checked first), AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24, 22), and the
 * kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM), asked only when the CPU has it all. */
static inline int ql_amx_ready_once(int *state, int (*avx512)(void)) {
    if (*state < 0) {
        unsigned a, b, c, d;
        int ok = avx512() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24) & 1 && (d >> 22) & 1;
        *state = ok && syscall(SYS_arch_prctl, QL_ARCH_REQ_XCOMP_PERM, QL_XFEATURE_XTILEDATA) == 0;
    }
    return *state;
}

/* The 64-byte operand of LDTILECFG. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ql_tile_config;

/* Configure tiles 0-7 (palette 1) with 16 rows each, colsb[i] bytes a row for tile i; the others unused. */
__attribute__((target("amx-tile"))) static inline void ql_load_tiles(const uint16_t colsb[8]) {
    ql_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = colsb[i];
    }
    _tile_loadconfig(&cfg);
}
#endif
#endif

/* VPTQ kernels for vector lengths other than 8 (VPTQ's v6, v12, v16 checkpoints) and float32 codebooks: an entry
 * as NC = ceil(V / 8) registers of 8 float32, plain loads (lanes past V dropped by masked stores; a table's last
 * entry through a register permute). Layout and arithmetic as in vq.c (the same float32 sums; vq_decode's one
 * rounding to bfloat16).
 *
 * Each kernel has its codebook dtype, NC and row count M as constants (one function per combination, chosen once
 * per call), so the M x NC sums stay in registers; with M read at run time they lived on the stack, a load and a
 * store around every FMA, and a v12 layer at one row took 3.5 times a v8 layer's time for fewer codes.
 *
 * With AVX-512, an entry of 9..16 values is one 16-lane register instead of two of 8 (VQ_ZMM): one load, one
 * conversion and one FMA per row where two were.
 */
#include "vq_common.h"

/* AVX-512 F for the sums; BW and VL for vq_decode's masked 16-bit store */
#if VQ_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VQ_ZMM 1
#else
#define VQ_ZMM 0
#endif

int vq_wide_ok(const vq_call *c) {
    /* load8_end reads the 8 values before a table's end: every table holds at least 8 */
    return c->v <= 16 && (c->dt == VQ_F32 || c->v % 2 == 0) && (c->g << c->cbits) * c->v >= 8 &&
           (!c->rbits || (c->g << c->rbits) * c->v >= 8);
}

#if VQ_AVX2
/* The last register of an entry: its values (1..8), their masks for the stores, and the tables' last rows. */
typedef struct {
    int tail;
    __m128i mask16;          /* 32-bit lanes holding its 16-bit values (pairs; V is even for 16-bit codebooks) */
    __m256i mask32;          /* its float32 lanes */
    __m256i down;            /* lane i <- lane i + 8 - tail (load8_end) */
    int64_t cb_end, rcb_end; /* the last row of the codebooks and of the residual codebooks */
} vq_tail;

static inline vq_tail tail_of(const vq_call *c, int nc) {
    vq_tail k;
    k.tail = c->v - 8 * (nc - 1);
    const int pairs = (k.tail + 1) / 2;
    k.mask16 = _mm_setr_epi32(pairs > 0 ? -1 : 0, pairs > 1 ? -1 : 0, pairs > 2 ? -1 : 0, pairs > 3 ? -1 : 0);
    int32_t m[8];
    for (int i = 0; i < 8; i++)
        m[i] = i < k.tail ? -1 : 0;
    k.mask32 = _mm256_loadu_si256((const __m256i *)m);
    for (int i = 0; i < 8; i++)
        m[i] = i + 8 - k.tail < 8 ? i + 8 - k.tail : 7;
    k.down = _mm256_loadu_si256((const __m256i *)m);
    k.cb_end = (c->g << c->cbits) - 1;
    k.rcb_end = (c->g << c->rbits) - 1;
    return k;
}

/* 8 values of a codebook from element `off` as float32. */
VQ_INLINE __m256 load8(const void *cb, const int dt, int64_t off) {
    if (dt == VQ_F32)
        return _mm256_loadu_ps((const float *)cb + off);
    return widen8(_mm_loadu_si128((const __m128i *)((const uint16_t *)cb + off)), dt);
}

/* The same for the last register of a table's last entry, which has only `tail` values and no next entry to read
 * into: the 8 values that end where the entry ends, moved down by 8 - tail lanes (a register permute: a copy
 * through memory or a masked load here, VMASKMOV, kept GCC from holding the sums in registers). */
VQ_INLINE __m256 load8_end(const void *cb, const int dt, int64_t off, const vq_tail *k) {
    return _mm256_permutevar8x32_ps(load8(cb, dt, off + k->tail - 8), k->down);
}

/* entry() as NC registers. Every register is a plain 8-value load: lanes past V hold the next entry's values,
 * which the sums carry and the masked stores drop; a table's last entry takes load8_end. */
VQ_INLINE void entry_n(const vq_call *c, int64_t g, uint32_t code, const vq_tail *k, __m256 *e, const int dt,
                       const int NC) {
    const int64_t row = (g << c->cbits) + (code & ((1u << c->cbits) - 1u));
    for (int q = 0; q < NC - 1; q++)
        e[q] = load8(c->cb, dt, row * c->v + 8 * q);
    e[NC - 1] = row < k->cb_end ? load8(c->cb, dt, row * c->v + 8 * (NC - 1))
                                : load8_end(c->cb, dt, row * c->v + 8 * (NC - 1), k);
    if (c->rcb) {
        const int64_t res = (g << c->rbits) + (code >> c->cbits);
        for (int q = 0; q < NC - 1; q++)
            e[q] = _mm256_add_ps(e[q], load8(c->rcb, dt, res * c->v + 8 * q));
        e[NC - 1] = _mm256_add_ps(e[NC - 1], res < k->rcb_end
                                                  ? load8(c->rcb, dt, res * c->v + 8 * (NC - 1))
                                                  : load8_end(c->rcb, dt, res * c->v + 8 * (NC - 1), k));
    }
}

/* Code t of vector j's stream s into one set of M x NC sums; x the group's first column (column-major from 3 rows,
 * else rows ldx apart). */
VQ_INLINE void wide_step(const vq_call *c, int64_t g, const uint32_t *s, const float *x, int64_t ldx, int64_t t,
                         const vq_tail *k, __m256 *a, const int dt, const int NC, const int M) {
    __m256 e[2];
    entry_n(c, g, code_at(c, s, t), k, e, dt, NC);
    for (int m = 0; m < M; m++) {
        const __m256 xv = _mm256_set1_ps(M >= 3 ? x[t * M + m] : x[m * ldx + t]);
        for (int q = 0; q < NC; q++)
            a[m * NC + q] = _mm256_fmadd_ps(xv, e[q], a[m * NC + q]);
    }
}

/* vq_mv's product for vector j. Below four sums (M x NC), U sets of them take turns over the codes, so consecutive
 * FMAs do not wait on each other. x is row-major up to 2 rows, column-major (c->xt) from 3, as vq_columns says.
 * The sums are one small array (U M NC <= 16) and the loops over sets have no early exit (a remainder loop
 * instead), so GCC keeps every sum in a register. */
VQ_INLINE void wide_rows(const vq_call *c, int64_t j, const int dt, const int NC, const int M) {
    const int U = M * NC >= 4 ? 1 : 4 / (M * NC);
    const vq_tail k = tail_of(c, NC);
    const int64_t ldx = c->ldx;
    __m256 acc[2 * VQ_MAX_M];
    for (int i = 0; i < U * M * NC; i++)
        acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const uint32_t *s = stream(c, g, j);
        const float *x = M >= 3 ? c->xt + c0 * M : c->x + c0;
        if (U == 1) {
            for (int64_t t = 0; t < tmax; t++)
                wide_step(c, g, s, x, ldx, t, &k, acc, dt, NC, M);
            continue;
        }
        int64_t t = 0;
        for (; t + U <= tmax; t += U)
            for (int u = 0; u < U; u++)
                wide_step(c, g, s, x, ldx, t + u, &k, acc + u * M * NC, dt, NC, M);
        for (; t < tmax; t++)
            wide_step(c, g, s, x, ldx, t, &k, acc, dt, NC, M);
    }
    for (int m = 0; m < M; m++) {
        float *y = c->y + m * c->ldy + j * c->v;
        for (int q = 0; q < NC; q++) {
            __m256 sum = acc[m * NC + q];
            for (int u = 1; u < U; u++)
                sum = _mm256_add_ps(sum, acc[(u * M + m) * NC + q]);
            if (q < NC - 1)
                _mm256_storeu_ps(y + 8 * q, sum);
            else
                _mm256_maskstore_ps(y + 8 * q, k.mask32, sum);
        }
    }
}

/* vq_decode's columns for vectors jb..jb+nb-1 (bfloat16, one rounding), each code's V values one run. */
VQ_INLINE void wide_decode(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo, const int dt,
                           const int NC) {
    const vq_tail k = tail_of(c, NC);
    __m256 e[2];
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        for (int64_t t = 0; t < tmax; t++)
            for (int64_t q = 0; q < nb; q++) {
                entry_n(c, g, code_at(c, stream(c, g, jb + q), t), &k, e, dt, NC);
                uint16_t *o = col + (c0 + t) * ldo + q * c->v;
                for (int r = 0; r < NC - 1; r++)
                    _mm_storeu_si128((__m128i *)(o + 8 * r), bf16x8(e[r]));
                const __m128i last = bf16x8(e[NC - 1]);
                if (k.tail % 2 == 0) {
                    _mm_maskstore_epi32((int *)(o + 8 * (NC - 1)), k.mask16, last);
                } else { /* an odd tail (float32 codebooks only): no 32-bit lane holds just its last value */
                    uint16_t buf[8];
                    _mm_storeu_si128((__m128i *)buf, last);
                    memcpy(o + 8 * (NC - 1), buf, (size_t)k.tail * 2);
                }
            }
    }
}

#if VQ_ZMM
/* vq_tail for an entry of 9..16 values in one 16-lane register (a struct of its own: the 512-bit field in vq_tail
 * changed the code GCC made for the 8-lane kernels) */
typedef struct {
    __m512i down;            /* lane i <- lane i + 16 - V (load16_end) */
    __mmask16 keep;          /* an entry's V lanes */
    int64_t cb_end, rcb_end; /* as in vq_tail */
} vq_tail16;

static inline vq_tail16 tail16_of(const vq_call *c) {
    vq_tail16 k;
    int32_t m[16];
    for (int i = 0; i < 16; i++)
        m[i] = i + 16 - c->v < 16 ? i + 16 - c->v : 15;
    k.down = _mm512_loadu_si512(m);
    k.keep = (__mmask16)((1u << c->v) - 1u);
    k.cb_end = (c->g << c->cbits) - 1;
    k.rcb_end = (c->g << c->rbits) - 1;
    return k;
}

/* load8 and load8_end for an entry of 9..16 values: 16 values from element `off`; for a table's last entry the 16
 * that end at element `end`, where it ends, moved down by 16 - V lanes. */
VQ_INLINE __m512 load16(const void *cb, const int dt, int64_t off) {
    if (dt == VQ_F32)
        return _mm512_loadu_ps((const float *)cb + off);
    return widen16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cb + off)), dt);
}

VQ_INLINE __m512 load16_end(const void *cb, const int dt, int64_t end, const vq_tail16 *k) {
    return _mm512_permutexvar_ps(k->down, load16(cb, dt, end - 16));
}

/* entry_n in one register: lanes past V hold the next entry's values, dropped by the masked stores. */
VQ_INLINE __m512 entry16(const vq_call *c, int64_t g, uint32_t code, const vq_tail16 *k, const int dt) {
    const int64_t row = (g << c->cbits) + (code & ((1u << c->cbits) - 1u));
    __m512 e = row < k->cb_end ? load16(c->cb, dt, row * c->v) : load16_end(c->cb, dt, (row + 1) * c->v, k);
    if (c->rcb) {
        const int64_t res = (g << c->rbits) + (code >> c->cbits);
        e = _mm512_add_ps(e, res < k->rcb_end ? load16(c->rcb, dt, res * c->v)
                                              : load16_end(c->rcb, dt, (res + 1) * c->v, k));
    }
    return e;
}

VQ_INLINE void wide_step16(const vq_call *c, int64_t g, const uint32_t *s, const float *x, int64_t ldx, int64_t t,
                           const vq_tail16 *k, __m512 *a, const int dt, const int M) {
    const __m512 e = entry16(c, g, code_at(c, s, t), k, dt);
#pragma GCC unroll 8
    for (int m = 0; m < M; m++)
        a[m] = _mm512_fmadd_ps(_mm512_set1_ps(M >= 3 ? x[t * M + m] : x[m * ldx + t]), e, a[m]);
}

/* wide_rows with one register an entry: U sets of M sums, 4 at one row, else 2 (one set from 4 rows, as wide_rows
 * has, took 11.5 against 9.5 ms at 4 rows and 17.0 against 13.0 at 8 on v12 4096x14336). The pragmas keep the
 * loops over sets and rows unrolled, which GCC once skipped (bfloat16, 2 rows, 4 sets: sums on the stack). */
VQ_INLINE void wide_rows16(const vq_call *c, int64_t j, const int dt, const int M) {
    const int U = M == 1 ? 4 : 2;
    const vq_tail16 k = tail16_of(c);
    const int64_t ldx = c->ldx;
    __m512 acc[2 * VQ_MAX_M];
    for (int i = 0; i < U * M; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const uint32_t *s = stream(c, g, j);
        const float *x = M >= 3 ? c->xt + c0 * M : c->x + c0;
        int64_t t = 0;
        for (; t + U <= tmax; t += U)
#pragma GCC unroll 16
            for (int u = 0; u < U; u++)
                wide_step16(c, g, s, x, ldx, t + u, &k, acc + u * M, dt, M);
        for (; t < tmax; t++)
            wide_step16(c, g, s, x, ldx, t, &k, acc, dt, M);
    }
    for (int m = 0; m < M; m++) {
        __m512 sum = acc[m];
        for (int u = 1; u < U; u++)
            sum = _mm512_add_ps(sum, acc[u * M + m]);
        _mm512_mask_storeu_ps(c->y + m * c->ldy + j * c->v, k.keep, sum);
    }
}

/* bf16x8 for 16 values (the same rounding) */
static inline __m256i bf16x16(__m512 e) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(e);
#else
    const __m512i u = _mm512_castps_si512(e);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
    return _mm512_cvtepi32_epi16(r);
#endif
}

/* wide_decode with one register an entry. */
VQ_INLINE void wide_decode16(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo, const int dt) {
    const vq_tail16 k = tail16_of(c);
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        for (int64_t t = 0; t < tmax; t++)
            for (int64_t q = 0; q < nb; q++) {
                const __m512 e = entry16(c, g, code_at(c, stream(c, g, jb + q), t), &k, dt);
                _mm256_mask_storeu_epi16(col + (c0 + t) * ldo + q * c->v, k.keep, bf16x16(e));
            }
    }
}

/* load16_end reads the 16 values before a table's end: both tables hold at least 16 (two entries of 9 do) */
static int zmm_ok(const vq_call *c) {
    return c->v > 8 && (c->g << c->cbits) * c->v >= 16 && (!c->rbits || (c->g << c->rbits) * c->v >= 16);
}
#endif

#define VQ_WIDE(name, DT, NC, M) \
    static void wide_##name##_##NC##_##M(const vq_call *c, int64_t j) { wide_rows(c, j, DT, NC, M); }
#define VQ_WIDE_ROWS(name, DT, NC) \
    VQ_WIDE(name, DT, NC, 1)       \
    VQ_WIDE(name, DT, NC, 2)       \
    VQ_WIDE(name, DT, NC, 3)       \
    VQ_WIDE(name, DT, NC, 4)       \
    VQ_WIDE(name, DT, NC, 5)       \
    VQ_WIDE(name, DT, NC, 6)       \
    VQ_WIDE(name, DT, NC, 7)       \
    VQ_WIDE(name, DT, NC, 8)       \
    static void wide_decode_##name##_##NC(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) { \
        wide_decode(c, jb, nb, col, ldo, DT, NC); \
    }
VQ_WIDE_ROWS(f16, VQ_F16, 1)
VQ_WIDE_ROWS(f16, VQ_F16, 2)
VQ_WIDE_ROWS(bf16, VQ_BF16, 1)
VQ_WIDE_ROWS(bf16, VQ_BF16, 2)
VQ_WIDE_ROWS(f32, VQ_F32, 1)
VQ_WIDE_ROWS(f32, VQ_F32, 2)
#undef VQ_WIDE_ROWS
#undef VQ_WIDE

#define VQ_WIDE_TABLE(name, NC)                                                                                  \
    {NULL, wide_##name##_##NC##_1, wide_##name##_##NC##_2, wide_##name##_##NC##_3, wide_##name##_##NC##_4,       \
     wide_##name##_##NC##_5, wide_##name##_##NC##_6, wide_##name##_##NC##_7, wide_##name##_##NC##_8}
/* [dtype][NC - 1][rows] */
static const vq_vector_fn WIDE[3][2][VQ_MAX_M + 1] = {{VQ_WIDE_TABLE(f16, 1), VQ_WIDE_TABLE(f16, 2)},
                                                      {VQ_WIDE_TABLE(bf16, 1), VQ_WIDE_TABLE(bf16, 2)},
                                                      {VQ_WIDE_TABLE(f32, 1), VQ_WIDE_TABLE(f32, 2)}};
static const vq_decode_fn WIDE_DECODE[3][2] = {{wide_decode_f16_1, wide_decode_f16_2},
                                               {wide_decode_bf16_1, wide_decode_bf16_2},
                                               {wide_decode_f32_1, wide_decode_f32_2}};

#if VQ_ZMM
/* The same with one 16-lane register an entry (z). */
#define VQ_WIDE16(name, DT, M) \
    static void wide_##name##_z_##M(const vq_call *c, int64_t j) { wide_rows16(c, j, DT, M); }
#define VQ_WIDE16_ROWS(name, DT) \
    VQ_WIDE16(name, DT, 1)       \
    VQ_WIDE16(name, DT, 2)       \
    VQ_WIDE16(name, DT, 3)       \
    VQ_WIDE16(name, DT, 4)       \
    VQ_WIDE16(name, DT, 5)       \
    VQ_WIDE16(name, DT, 6)       \
    VQ_WIDE16(name, DT, 7)       \
    VQ_WIDE16(name, DT, 8)       \
    static void wide_decode_##name##_z(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) { \
        wide_decode16(c, jb, nb, col, ldo, DT); \
    }
VQ_WIDE16_ROWS(f16, VQ_F16)
VQ_WIDE16_ROWS(bf16, VQ_BF16)
VQ_WIDE16_ROWS(f32, VQ_F32)
#undef VQ_WIDE16_ROWS
#undef VQ_WIDE16
/* [dtype][rows] */
static const vq_vector_fn WIDE16[3][VQ_MAX_M + 1] = {VQ_WIDE_TABLE(f16, z), VQ_WIDE_TABLE(bf16, z),
                                                     VQ_WIDE_TABLE(f32, z)};
static const vq_decode_fn WIDE16_DECODE[3] = {wide_decode_f16_z, wide_decode_bf16_z, wide_decode_f32_z};
#endif
#undef VQ_WIDE_TABLE

vq_vector_fn vq_wide_vector(const vq_call *c) {
#if VQ_ZMM
    /* not at one row with a residual codebook, where it lost 4-5 % (v16 + residual 4096x14336: 19.9 against 18.9 ms) */
    if (zmm_ok(c) && (c->m > 1 || !c->rcb))
        return WIDE16[c->dt][c->m];
#endif
    return WIDE[c->dt][(c->v + 7) / 8 - 1][c->m];
}

vq_decode_fn vq_wide_decode(const vq_call *c) {
#if VQ_ZMM
    if (zmm_ok(c))
        return WIDE16_DECODE[c->dt];
#endif
    return WIDE_DECODE[c->dt][(c->v + 7) / 8 - 1];
}
#endif

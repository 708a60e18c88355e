/* VPTQ vector-quantized weights times a few activation rows, on a CPU (qlinear_native._vq).
 *
 * Layout (qlinear's layouts/vptq.py): a weight [N, Kmain] is cut along N into J = ceil(N / V) vectors of V rows;
 * columns are split into G groups of gs columns, each with its own codebook. indices[g][j] is one LSB-first bit
 * stream of W int32 words holding gs codes of `bits` bits (code t at bit t * bits, possibly straddling two words),
 * each (res << cbits) | main. Column c = g * gs + t of vector j is cb[g][main] (+ rcb[g][res]), V values.
 *
 * vq_decode writes vectors j0..j1-1 of that weight in bfloat16, transposed ([Kmain, rows]; the sum in float32, one
 * rounding), for the caller's GEMM at larger M.
 *
 * vq_mv computes y[m][j * V + v] = sum_c x[m][c] * (cb[g][main] + rcb[g][res])[v] over main columns c < kmain,
 * in float32: codebook values converted exactly from float16 / bfloat16 / float32, codebook and residual added in
 * float32, products and sums in float32 (no per-operation rounding to the codebook dtype: the producers' decode
 * rounds there; the caller's tests bound the difference). x is float32 [M, ldx] (the caller applies the
 * permutation and the per-column norm scale); y is float32 [M, ldy], ldy >= J * V. Each thread takes whole
 * vectors in a fixed order, so results do not depend on the thread count.
 */
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"
#include "vq.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define VQ_AVX2 1
#else
#define VQ_AVX2 0
#endif

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31u, man = h & 0x3FFu, u;
    if (exp == 31)
        u = sign | 0x7F800000u | (man << 13);
    else if (exp)
        u = sign | ((exp + 112u) << 23) | (man << 13);
    else if (!man)
        u = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* V values of entry `row` of a codebook of dtype dt, as float32 (exact). */
static inline void load_entry(const void *cb, int dt, int64_t row, int v, float *out) {
    const int64_t off = row * v;
    if (dt == VQ_F32) {
        memcpy(out, (const float *)cb + off, (size_t)v * 4);
    } else if (dt == VQ_BF16) {
        const uint16_t *p = (const uint16_t *)cb + off;
        for (int i = 0; i < v; i++) {
            uint32_t u = (uint32_t)p[i] << 16;
            memcpy(out + i, &u, 4);
        }
    } else {
        const uint16_t *p = (const uint16_t *)cb + off;
        for (int i = 0; i < v; i++)
            out[i] = f16_to_f32(p[i]);
    }
}

/* Vector j's code stream in group g. */
static inline const uint32_t *stream(const vq_call *c, int64_t g, int64_t j) { return c->idx + (g * c->j + j) * c->w; }

/* Code t of a stream; 16-bit codes (k65536 alone) are halfword t, little-endian. */
static inline uint32_t code_at(const vq_call *c, const uint32_t *s, int64_t t) {
    const int bits = c->cbits + c->rbits;
    if (bits == 16)
        return ((const uint16_t *)s)[t];
    const int64_t bit = t * bits, word = bit >> 5;
    uint64_t u = s[word];
    if (word + 1 < c->w)
        u |= (uint64_t)s[word + 1] << 32;
    return (uint32_t)(u >> (bit & 31)) & (bits >= 32 ? 0xFFFFFFFFu : (1u << bits) - 1u);
}

/* Main columns of group g: the first, and how many (the last group may be padded past Kmain). */
static inline int64_t group_cols(const vq_call *c, int64_t g, int64_t *c0) {
    *c0 = g * c->gs;
    return c->kmain - *c0 < c->gs ? c->kmain - *c0 : c->gs;
}

/* The V float32 values a code stands for in group g: its codebook entry plus its residual entry (exact sums of
 * float16 / bfloat16 values in float32, as vq_mv and vq_decode both form them). */
static inline void entry(const vq_call *c, int64_t g, uint32_t code, float *e) {
    float r[VQ_MAX_V];
    load_entry(c->cb, c->dt, (g << c->cbits) + (code & ((1u << c->cbits) - 1u)), c->v, e);
    if (c->rcb) {
        load_entry(c->rcb, c->dt, (g << c->rbits) + (code >> c->cbits), c->v, r);
        for (int i = 0; i < c->v; i++)
            e[i] += r[i];
    }
}

#if VQ_AVX2
/* 8 16-bit codebook values as float32: F16C for float16, the high half of a float32 for bfloat16. */
static inline __m256 widen8(__m128i h, int dt) {
    if (dt == VQ_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* entry() for V == 8 and 16-bit codebooks of dtype dt (a constant where inlined): one conversion per table. */
static inline __m256 entry8(const vq_call *c, int64_t g, uint32_t code, const int dt) {
    const uint16_t *cb = (const uint16_t *)c->cb + ((g << c->cbits) + (code & ((1u << c->cbits) - 1u))) * 8;
    __m256 e = widen8(_mm_loadu_si128((const __m128i *)cb), dt);
    if (c->rcb) {
        const uint16_t *rcb = (const uint16_t *)c->rcb + ((g << c->rbits) + (code >> c->cbits)) * 8;
        e = _mm256_add_ps(e, widen8(_mm_loadu_si128((const __m128i *)rcb), dt));
    }
    return e;
}

/* The V == 8 kernels below take dt as a constant (always inlined into one function per dtype, vq_run's switch). */
#define VQ_INLINE static inline __attribute__((always_inline))

/* V == 8, 16-bit codebooks, M rows (a constant where inlined): one FMA per row and code. With M known the loops
 * over rows unroll and the M sums stay in registers (with M read at run time they lived on the stack, a load and a
 * store around every FMA), and x comes column-major (c->xt [Kmain][M]: vq_columns), so a code's M broadcasts read
 * one short run at constant offsets from one pointer. */
VQ_INLINE void vector8(const vq_call *c, int64_t j, const int dt, const int M) {
    __m256 acc[VQ_MAX_M];
    for (int m = 0; m < M; m++)
        acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const float *x = c->xt + c0 * M;
        const uint32_t *s = stream(c, g, j);
        for (int64_t t = 0; t < tmax; t++) {
            const __m256 e = entry8(c, g, code_at(c, s, t), dt);
            for (int m = 0; m < M; m++)
                acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(x[t * M + m]), e, acc[m]);
        }
    }
    for (int m = 0; m < M; m++)
        _mm256_storeu_ps(c->y + m * c->ldy + j * 8, acc[m]);
}

/* V == 8, 16-bit codebooks, one or two rows: four sets of sums taking turns over the codes, so consecutive FMAs
 * do not wait on each other (one chain of 4-cycle FMAs bounded the one-row kernel). */
VQ_INLINE void vector8_few(const vq_call *c, int64_t j, const int dt) {
    __m256 acc[4][2];
    for (int u = 0; u < 4; u++)
        acc[u][0] = acc[u][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const float *x0 = c->x + c0, *x1 = c->x + c->ldx + c0;
        const uint32_t *s = stream(c, g, j);
        for (int64_t t0 = 0; t0 < tmax; t0 += 4) {
            for (int u = 0; u < 4 && t0 + u < tmax; u++) {
                const int64_t t = t0 + u;
                const __m256 e = entry8(c, g, code_at(c, s, t), dt);
                acc[u][0] = _mm256_fmadd_ps(_mm256_set1_ps(x0[t]), e, acc[u][0]);
                if (c->m == 2)
                    acc[u][1] = _mm256_fmadd_ps(_mm256_set1_ps(x1[t]), e, acc[u][1]);
            }
        }
    }
    for (int64_t m = 0; m < c->m; m++)
        _mm256_storeu_ps(c->y + m * c->ldy + j * 8, _mm256_add_ps(_mm256_add_ps(acc[0][m], acc[1][m]),
                                                                  _mm256_add_ps(acc[2][m], acc[3][m])));
}

/* float32 -> bfloat16, round to nearest even, as ql_bf16 (finite values; the sums of 16-bit codebook values here
 * are never float32 subnormals, which VCVTNEPS2BF16 would flush) */
static inline __m128i bf16x8(__m256 e) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    return (__m128i)_mm256_cvtneps_pbh(e);
#else
    const __m256i u = _mm256_castps_si256(e);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
#endif
}

/* V == 8, 16-bit codebooks: vectors jb..jb+nb-1 (nb <= 4) side by side, so each column's nb codes fill one 64-byte
 * run of the tile (a whole cache line when aligned) instead of nb scattered 16-byte pieces. */
VQ_INLINE void decode8(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo, const int dt) {
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        for (int64_t t = 0; t < tmax; t++)
            for (int64_t q = 0; q < nb; q++) {
                const __m256 e = entry8(c, g, code_at(c, stream(c, g, jb + q), t), dt);
                _mm_storeu_si128((__m128i *)(col + (c0 + t) * ldo + q * 8), bf16x8(e));
            }
    }
}
/* vq_mv / vq_decode for V == 8 and 16-bit codebooks: one function per kernel and dtype. */
typedef void (*vq_vector_fn)(const vq_call *c, int64_t j);
#define VQ_ROWS(M)                                                                                                   \
    static void vector8_f16_##M(const vq_call *c, int64_t j) { vector8(c, j, VQ_F16, M); }                           \
    static void vector8_bf16_##M(const vq_call *c, int64_t j) { vector8(c, j, VQ_BF16, M); }
VQ_ROWS(3)
VQ_ROWS(4)
VQ_ROWS(5)
VQ_ROWS(6)
VQ_ROWS(7)
VQ_ROWS(8)
#undef VQ_ROWS
static void vector8_few_f16(const vq_call *c, int64_t j) { vector8_few(c, j, VQ_F16); }
static void vector8_few_bf16(const vq_call *c, int64_t j) { vector8_few(c, j, VQ_BF16); }

/* [dtype is bfloat16][rows]: the kernel for 1..VQ_MAX_M rows */
static const vq_vector_fn VECTOR8[2][VQ_MAX_M + 1] = {
    {NULL, vector8_few_f16, vector8_few_f16, vector8_f16_3, vector8_f16_4, vector8_f16_5, vector8_f16_6,
     vector8_f16_7, vector8_f16_8},
    {NULL, vector8_few_bf16, vector8_few_bf16, vector8_bf16_3, vector8_bf16_4, vector8_bf16_5, vector8_bf16_6,
     vector8_bf16_7, vector8_bf16_8}};

static void run8(const vq_call *c, int64_t j) { VECTOR8[c->dt != VQ_F16][c->m](c, j); }

static void decode8_any(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) {
    if (c->dt == VQ_F16)
        decode8(c, jb, nb, col, ldo, VQ_F16);
    else
        decode8(c, jb, nb, col, ldo, VQ_BF16);
}

/* Any codebook dtype and V <= VQ_MAX_V with 16-bit values in pairs (V even, or float32): an entry as nc = ceil(V / 8)
 * registers of 8 float32, the last one loaded with a mask (VMASKMOV never touches the masked-off bytes, so the
 * table's last entry is read safely). */
typedef struct {
    int nc, tail;             /* registers per entry; values in the last one (1..8) */
    __m128i mask16;           /* 32-bit lanes of the last register's 16-bit values (tail / 2 of them) */
    __m256i mask32;           /* its float32 lanes */
} vq_chunks;

static inline int wide_ok(const vq_call *c) { return c->dt == VQ_F32 || c->v % 2 == 0; }

static inline vq_chunks chunks_of(int v) {
    vq_chunks k;
    k.nc = (v + 7) / 8;
    k.tail = v - 8 * (k.nc - 1);
    const int pairs = (k.tail + 1) / 2;
    k.mask16 = _mm_setr_epi32(pairs > 0 ? -1 : 0, pairs > 1 ? -1 : 0, pairs > 2 ? -1 : 0, pairs > 3 ? -1 : 0);
    int32_t m[8];
    for (int i = 0; i < 8; i++)
        m[i] = i < k.tail ? -1 : 0;
    k.mask32 = _mm256_loadu_si256((const __m256i *)m);
    return k;
}

/* 8 values of a codebook from element `off` as float32 (the last register of an entry masked). */
static inline __m256 load8(const void *cb, int dt, int64_t off, int last, const vq_chunks *k) {
    if (dt == VQ_F32)
        return last ? _mm256_maskload_ps((const float *)cb + off, k->mask32)
                    : _mm256_loadu_ps((const float *)cb + off);
    const __m128i *p = (const __m128i *)((const uint16_t *)cb + off);
    return widen8(last ? _mm_maskload_epi32((const int *)p, k->mask16) : _mm_loadu_si128(p), dt);
}

/* entry() as nc registers. */
static inline void entry_wide(const vq_call *c, int64_t g, uint32_t code, const vq_chunks *k, __m256 *e) {
    const int64_t row = (g << c->cbits) + (code & ((1u << c->cbits) - 1u));
    for (int q = 0; q < k->nc; q++)
        e[q] = load8(c->cb, c->dt, row * c->v + 8 * q, q == k->nc - 1 && k->tail < 8, k);
    if (c->rcb) {
        const int64_t res = (g << c->rbits) + (code >> c->cbits);
        for (int q = 0; q < k->nc; q++)
            e[q] = _mm256_add_ps(e[q], load8(c->rcb, c->dt, res * c->v + 8 * q, q == k->nc - 1 && k->tail < 8, k));
    }
}

/* vq_mv's product for vector j with any such V and dtype: nc FMAs per row and code. */
static void vector_wide(const vq_call *c, int64_t j) {
    const vq_chunks k = chunks_of(c->v);
    __m256 acc[VQ_MAX_M][VQ_MAX_V / 8], e[VQ_MAX_V / 8];
    for (int64_t m = 0; m < c->m; m++)
        for (int q = 0; q < k.nc; q++)
            acc[m][q] = _mm256_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const uint32_t *s = stream(c, g, j);
        for (int64_t t = 0; t < tmax; t++) {
            entry_wide(c, g, code_at(c, s, t), &k, e);
            for (int64_t m = 0; m < c->m; m++) {
                const __m256 xv = _mm256_set1_ps(c->x[m * c->ldx + c0 + t]);
                for (int q = 0; q < k.nc; q++)
                    acc[m][q] = _mm256_fmadd_ps(xv, e[q], acc[m][q]);
            }
        }
    }
    for (int64_t m = 0; m < c->m; m++) {
        float *y = c->y + m * c->ldy + j * c->v;
        for (int q = 0; q < k.nc - 1; q++)
            _mm256_storeu_ps(y + 8 * q, acc[m][q]);
        _mm256_maskstore_ps(y + 8 * (k.nc - 1), k.mask32, acc[m][k.nc - 1]);
    }
}

/* vq_decode's columns for vectors jb..jb+nb-1 with any such V and dtype (bfloat16, one rounding). */
static void decode_wide(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) {
    const vq_chunks k = chunks_of(c->v);
    __m256 e[VQ_MAX_V / 8];
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        for (int64_t t = 0; t < tmax; t++)
            for (int64_t q = 0; q < nb; q++) {
                entry_wide(c, g, code_at(c, stream(c, g, jb + q), t), &k, e);
                uint16_t *o = col + (c0 + t) * ldo + q * c->v;
                for (int r = 0; r < k.nc - 1; r++)
                    _mm_storeu_si128((__m128i *)(o + 8 * r), bf16x8(e[r]));
                uint16_t last[8];
                _mm_storeu_si128((__m128i *)last, bf16x8(e[k.nc - 1]));
                memcpy(o + 8 * (k.nc - 1), last, (size_t)k.tail * 2);
            }
    }
}
#endif

/* Any V <= VQ_MAX_V and codebook dtype: scalar loops the compiler may vectorise. */
static void vector_any(const vq_call *c, int64_t j) {
    float acc[VQ_MAX_M][VQ_MAX_V], e[VQ_MAX_V];
    memset(acc, 0, sizeof(acc));
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const uint32_t *s = stream(c, g, j);
        for (int64_t t = 0; t < tmax; t++) {
            entry(c, g, code_at(c, s, t), e);
            for (int64_t m = 0; m < c->m; m++) {
                const float xv = c->x[m * c->ldx + c0 + t];
                for (int i = 0; i < c->v; i++)
                    acc[m][i] += xv * e[i];
            }
        }
    }
    for (int64_t m = 0; m < c->m; m++)
        memcpy(c->y + m * c->ldy + j * c->v, acc[m], (size_t)c->v * 4);
}

int vq_columns(const vq_call *c) { return VQ_AVX2 && c->v == 8 && c->dt != VQ_F32 && c->m >= 3; }

void vq_run(const vq_call *c) {
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(c->threads, c->j))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(c->j, &lo, &hi);
        for (int64_t j = lo; j < hi; j++) {
#if VQ_AVX2
            if (c->v == 8 && c->dt != VQ_F32) {
                run8(c, j);
                continue;
            }
            if (wide_ok(c)) {
                vector_wide(c, j);
                continue;
            }
#endif
            vector_any(c, j);
        }
    }
}

#if VQ_AVX2
/* V == 8, a bfloat16 codebook without a residual: each code's 8 values copied as they are (decode8 would widen and
 * round them back to themselves), vectors jb..jb+nb-1 side by side as decode8 lays them. decode_product hands a
 * float16 codebook over rounded to bfloat16 once per call, so such layers take this path too. */
static void decode8_copy(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) {
    const uint32_t mask = (1u << c->cbits) - 1u;
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const uint16_t *tg = (const uint16_t *)c->cb + (g << c->cbits) * 8;
        for (int64_t t = 0; t < tmax; t++)
            for (int64_t q = 0; q < nb; q++) {
                const uint32_t code = code_at(c, stream(c, g, jb + q), t) & mask;
                _mm_storeu_si128((__m128i *)(col + (c0 + t) * ldo + q * 8),
                                 _mm_loadu_si128((const __m128i *)(tg + code * 8)));
            }
    }
}
#endif

/* Vectors j0..j1-1 of the main weight decoded to bfloat16, transposed for the caller's GEMM: out[c][(j - j0) V + v]
 * = bf16(entry(code)[v]) for main columns c < kmain (one rounding to nearest even), so each code's V values are one
 * contiguous store; threads take blocks of 4 vectors. */
void vq_decode_cols(const vq_call *c, int64_t j0, int64_t j1, uint16_t *out, int64_t ldo) {
    const int64_t units = (j1 - j0 + 3) / 4;
#if VQ_AVX2
    const int copy = c->v == 8 && c->dt == VQ_BF16 && !c->rcb;
#endif
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(c->threads, units))
#endif
    {
        int64_t lo, hi;
        float e[VQ_MAX_V];
        ql_thread_share(units, &lo, &hi);
        for (int64_t u = lo; u < hi; u++) {
            const int64_t jb = j0 + 4 * u, nb = j1 - jb < 4 ? j1 - jb : 4;
#if VQ_AVX2
            if (copy) {
                decode8_copy(c, jb, nb, out + (jb - j0) * 8, ldo);
                continue;
            }
            if (c->v == 8 && c->dt != VQ_F32) {
                decode8_any(c, jb, nb, out + (jb - j0) * 8, ldo);
                continue;
            }
            if (wide_ok(c)) {
                decode_wide(c, jb, nb, out + (jb - j0) * c->v, ldo);
                continue;
            }
#endif
            for (int64_t j = jb; j < jb + nb; j++)
                for (int64_t g = 0; g < c->g; g++) {
                    int64_t c0;
                    const int64_t tmax = group_cols(c, g, &c0);
                    const uint32_t *s = stream(c, g, j);
                    for (int64_t t = 0; t < tmax; t++) {
                        entry(c, g, code_at(c, s, t), e);
                        for (int i = 0; i < c->v; i++)
                            out[(c0 + t) * ldo + (j - j0) * c->v + i] = ql_bf16(e[i]);
                    }
                }
        }
    }
}

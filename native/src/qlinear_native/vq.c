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
#include "vq_common.h"

#if VQ_AVX2
/* V == 8, 16-bit codebooks, M rows (a constant where inlined): one FMA per row and code. With M known the loops
 * over rows unroll and the M sums stay in registers (with M read at run time they lived on the stack, a load and a
 * store around every FMA), and x comes column-major (c->xt [Kmain][M]: vq_columns), so a code's M broadcasts read
 * one short run at constant offsets from one pointer. */
VQ_INLINE void vector8(const vq_call *c, int64_t j, const int dt, const int M) {
    __m256 acc[VQ_MAX_M_PAIRS];
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

#if defined(__AVX512F__)
/* Two 8-value entries of a table (rows a and b) side by side, as float32. */
static inline __m512 two_entries(const uint16_t *table, uint32_t a, uint32_t b, const int dt) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)(table + a * 8));
    const __m128i hi = _mm_loadu_si128((const __m128i *)(table + b * 8));
    return widen16(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), dt);
}

/* The entries of two codes side by side in one register (vector j's values, then vector j + 1's). */
static inline __m512 entry8x2(const vq_call *c, int64_t g, uint32_t a, uint32_t b, const int dt) {
    const uint32_t mask = (1u << c->cbits) - 1u;
    __m512 e = two_entries((const uint16_t *)c->cb + (g << c->cbits) * 8, a & mask, b & mask, dt);
    if (c->rcb)
        e = _mm512_add_ps(e, two_entries((const uint16_t *)c->rcb + (g << c->rbits) * 8, a >> c->cbits,
                                         b >> c->cbits, dt));
    return e;
}

/* vector8 for vectors j and j + 1 at once (the last vector alone when J is odd): their two entries at a column
 * fill one 16-lane register, so each row's broadcast and FMA serve both; the same float32 arithmetic in half the
 * FMAs, which bound vector8 (two a cycle, M a code). */
VQ_INLINE void vector8x2(const vq_call *c, int64_t j, const int dt, const int M) {
    if (j + 1 >= c->j) {
        vector8(c, j, dt, M);
        return;
    }
    __m512 acc[VQ_MAX_M_PAIRS];
    for (int m = 0; m < M; m++)
        acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < c->g; g++) {
        int64_t c0;
        const int64_t tmax = group_cols(c, g, &c0);
        const float *x = c->xt + c0 * M;
        const uint32_t *s0 = stream(c, g, j), *s1 = stream(c, g, j + 1);
        for (int64_t t = 0; t < tmax; t++) {
            const __m512 e = entry8x2(c, g, code_at(c, s0, t), code_at(c, s1, t), dt);
            for (int m = 0; m < M; m++)
                acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[t * M + m]), e, acc[m]);
        }
    }
    for (int m = 0; m < M; m++)
        _mm512_storeu_ps(c->y + m * c->ldy + j * 8, acc[m]);
}
#define VQ_PAIRS 2
#define vector8_rows vector8x2
#else
#define VQ_PAIRS 1
#define vector8_rows vector8
#endif

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
#define VQ_ROWS(M)                                                                                                   \
    static void vector8_f16_##M(const vq_call *c, int64_t j) { vector8_rows(c, j, VQ_F16, M); }                      \
    static void vector8_bf16_##M(const vq_call *c, int64_t j) { vector8_rows(c, j, VQ_BF16, M); }
VQ_ROWS(3)
VQ_ROWS(4)
VQ_ROWS(5)
VQ_ROWS(6)
VQ_ROWS(7)
VQ_ROWS(8)
#if VQ_PAIRS == 2 /* 9..16 rows: two vectors' 16 sums in 16 of the 32 zmm registers */
VQ_ROWS(9)
VQ_ROWS(10)
VQ_ROWS(11)
VQ_ROWS(12)
VQ_ROWS(13)
VQ_ROWS(14)
VQ_ROWS(15)
VQ_ROWS(16)
#define VQ_ROWS_PAIRS(d) , vector8_##d##_9, vector8_##d##_10, vector8_##d##_11, vector8_##d##_12, vector8_##d##_13, \
                         vector8_##d##_14, vector8_##d##_15, vector8_##d##_16
#else
#define VQ_ROWS_PAIRS(d)
#endif
#undef VQ_ROWS
static void vector8_few_f16(const vq_call *c, int64_t j) { vector8_few(c, j, VQ_F16); }
static void vector8_few_bf16(const vq_call *c, int64_t j) { vector8_few(c, j, VQ_BF16); }

/* [dtype is bfloat16][rows]: the kernel for 1..vq_max_rows rows */
static const vq_vector_fn VECTOR8[2][VQ_MAX_M_PAIRS + 1] = {
    {NULL, vector8_few_f16, vector8_few_f16, vector8_f16_3, vector8_f16_4, vector8_f16_5, vector8_f16_6,
     vector8_f16_7, vector8_f16_8 VQ_ROWS_PAIRS(f16)},
    {NULL, vector8_few_bf16, vector8_few_bf16, vector8_bf16_3, vector8_bf16_4, vector8_bf16_5, vector8_bf16_6,
     vector8_bf16_7, vector8_bf16_8 VQ_ROWS_PAIRS(bf16)}};
#undef VQ_ROWS_PAIRS

static void decode8_any(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) {
    if (c->dt == VQ_F16)
        decode8(c, jb, nb, col, ldo, VQ_F16);
    else
        decode8(c, jb, nb, col, ldo, VQ_BF16);
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

int vq_max_rows(const vq_call *c) {
#if VQ_AVX2
    if (VQ_PAIRS == 2 && c->v == 8 && c->dt != VQ_F32)
        return VQ_MAX_M_PAIRS;
#endif
    return VQ_MAX_M;
}

int vq_columns(const vq_call *c) {
    return VQ_AVX2 && c->m >= 3 && ((c->v == 8 && c->dt != VQ_F32) || vq_wide_ok(c));
}

/* The product kernel for a call (vq_columns says which of them read xt) and how many vectors one call of it
 * takes from its first (the V == 8 kernels for 3 rows and more: two where AVX-512 holds both). */
static vq_vector_fn product_kernel(const vq_call *c, int *per) {
    *per = 1;
#if VQ_AVX2
    if (c->v == 8 && c->dt != VQ_F32) {
        *per = c->m >= 3 ? VQ_PAIRS : 1; /* pairs lost at one row (8.3 against 7.3 ms) */
        return VECTOR8[c->dt != VQ_F16][c->m];
    }
    if (vq_wide_ok(c))
        return vq_wide_vector(c);
#endif
    return vector_any;
}

void vq_run(const vq_call *c) {
    int per;
    const vq_vector_fn kernel = product_kernel(c, &per);
    const int64_t units = (c->j + per - 1) / per;
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(c->threads, units))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        for (int64_t u = lo; u < hi; u++)
            kernel(c, u * per);
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

/* Any V <= VQ_MAX_V and codebook dtype: scalar loops. */
static void decode_any(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo) {
    float e[VQ_MAX_V];
    for (int64_t q = 0; q < nb; q++)
        for (int64_t g = 0; g < c->g; g++) {
            int64_t c0;
            const int64_t tmax = group_cols(c, g, &c0);
            const uint32_t *s = stream(c, g, jb + q);
            for (int64_t t = 0; t < tmax; t++) {
                entry(c, g, code_at(c, s, t), e);
                for (int i = 0; i < c->v; i++)
                    col[(c0 + t) * ldo + q * c->v + i] = ql_bf16(e[i]);
            }
        }
}

/* The decode kernel for a call. */
static vq_decode_fn decode_kernel(const vq_call *c) {
#if VQ_AVX2
    if (c->v == 8 && c->dt == VQ_BF16 && !c->rcb)
        return decode8_copy;
    if (c->v == 8 && c->dt != VQ_F32)
        return decode8_any;
    if (vq_wide_ok(c))
        return vq_wide_decode(c);
#endif
    return decode_any;
}

/* Vectors j0..j1-1 of the main weight decoded to bfloat16, transposed for the caller's GEMM: out[c][(j - j0) V + v]
 * = bf16(entry(code)[v]) for main columns c < kmain (one rounding to nearest even), so each code's V values are one
 * contiguous store; threads take blocks of 4 vectors. */
void vq_decode_cols(const vq_call *c, int64_t j0, int64_t j1, uint16_t *out, int64_t ldo) {
    const int64_t units = (j1 - j0 + 3) / 4;
    const vq_decode_fn kernel = decode_kernel(c);
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(c->threads, units))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        for (int64_t u = lo; u < hi; u++) {
            const int64_t jb = j0 + 4 * u, nb = j1 - jb < 4 ? j1 - jb : 4;
            kernel(c, jb, nb, out + (jb - j0) * c->v, ldo);
        }
    }
}

/* Helpers vq.c (V == 8 kernels, the drivers) and vq_wide.c (other vector lengths, float32 codebooks) share: reading
 * a code, a codebook entry as float32, the float32 -> bfloat16 rounding. Internal to the _vq extension. */
#ifndef QLINEAR_VQ_COMMON_H
#define QLINEAR_VQ_COMMON_H
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

#if defined(__AVX512F__)
/* 16 16-bit codebook values as float32 (widen8 on a 512-bit register). */
static inline __m512 widen16(__m256i h, const int dt) {
    if (dt == VQ_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

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
#endif

/* Kernels whose dtype, vector length or row count are constants where inlined (one function per combination). */
#define VQ_INLINE static inline __attribute__((always_inline))

/* One vector's product (vq_run) and a block of vectors' bfloat16 columns (vq_decode_cols). */
typedef void (*vq_vector_fn)(const vq_call *c, int64_t j);
typedef void (*vq_decode_fn)(const vq_call *c, int64_t jb, int64_t nb, uint16_t *col, int64_t ldo);

/* vq_wide.c: V != 8 with 16-bit values in pairs (V even) up to 16, or float32 codebooks with V <= 16; whether a call
 * is one, and its kernels (x column-major from 3 rows, as the V == 8 kernels). */
int vq_wide_ok(const vq_call *c);
#if VQ_AVX2
vq_vector_fn vq_wide_vector(const vq_call *c);
vq_decode_fn vq_wide_decode(const vq_call *c);
#endif
#endif

/* int4pack CPU bytes -> bfloat16 weight tile with group scales, for qlinear's decode + bf16 GEMM path.
 *
 * Layout (torch's _convert_weight_to_int4pack_for_cpu on AVX512 builds): blocks of 2*half output channels,
 * each [k][half] bytes; byte j of row r holds channel j in its low nibble and channel j + half in its high
 * nibble. out[r][b*2*half + c] = bf16((q - 8) * scale[r / group][col0 + b*2*half + c]), rounded to nearest
 * even once, as torch's bf16 multiply does. Pointers are passed as integers (tensor data_ptr()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__) && defined(__AVX512VL__)
#include <immintrin.h>
#define QL_SIMD 1
#else
#define QL_SIMD 0
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void decode_row_scalar(const uint8_t *row, const uint16_t *s, uint16_t *o, int64_t half) {
    for (int64_t j = 0; j < half; j++) {
        o[j] = f32_to_bf16((float)((int)(row[j] & 15) - 8) * bf16_to_f32(s[j]));
        o[j + half] = f32_to_bf16((float)((int)(row[j] >> 4) - 8) * bf16_to_f32(s[j + half]));
    }
}

#if QL_SIMD
/* 16 nibble codes (as bytes) times 16 bf16 scales -> 16 float32 */
static inline __m512 scaled16(__m128i codes, const uint16_t *s) {
    __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(codes), _mm512_set1_epi32(8));
    __m512 sf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), sf);
}

/* half == 32: one 32-byte row -> 64 bf16 */
static inline void decode_row32(const uint8_t *row, const uint16_t *s, uint16_t *o) {
    __m256i v = _mm256_loadu_si256((const __m256i *)row);
    __m256i mask = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(v, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    __m512 a = scaled16(_mm256_castsi256_si128(lo), s);
    __m512 b = scaled16(_mm256_extracti128_si256(lo, 1), s + 16);
    __m512 c = scaled16(_mm256_castsi256_si128(hi), s + 32);
    __m512 d = scaled16(_mm256_extracti128_si256(hi, 1), s + 48);
    _mm512_storeu_si512((void *)o, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    _mm512_storeu_si512((void *)(o + 32), (__m512i)_mm512_cvtne2ps_pbh(d, c));
}
#endif

static PyObject *decode_int4_bf16(PyObject *self, PyObject *args) {
    unsigned long long p_packed, p_scales, p_out;
    long long k, group, n_pad, col0, nblocks, half, ld;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLLLLLLL", &p_packed, &p_scales, &p_out, &k, &group, &n_pad, &col0, &nblocks,
                          &half, &ld))
        return NULL;
    if (k <= 0 || group <= 0 || half <= 0 || nblocks < 0 || ld < nblocks * 2 * half) {
        PyErr_SetString(PyExc_ValueError, "decode_int4_bf16: inconsistent sizes");
        return NULL;
    }
    const uint8_t *packed = (const uint8_t *)(uintptr_t)p_packed;
    const uint16_t *scales = (const uint16_t *)(uintptr_t)p_scales;
    uint16_t *out = (uint16_t *)(uintptr_t)p_out;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *pb = packed + b * k * half;
        int64_t c0 = col0 + b * 2 * half;
        for (int64_t r = 0; r < k; r++) {
            const uint8_t *row = pb + r * half;
            const uint16_t *s = scales + (r / group) * n_pad + c0;
            uint16_t *o = out + r * ld + b * 2 * half;
#if QL_SIMD
            if (half == 32) {
                decode_row32(row, s, o);
                continue;
            }
#endif
            decode_row_scalar(row, s, o, half);
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_int4_bf16", decode_int4_bf16, METH_VARARGS,
     "decode_int4_bf16(packed, scales, out, k, group, n_pad, col0, nblocks, half, ld): int4pack bytes -> bf16 tile"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decode(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "simd", QL_SIMD) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

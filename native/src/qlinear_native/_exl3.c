/* EXL3 trellis tiles decoded to float32 on a CPU (qlinear_native._exl3), for ExllamaV3TorchLinear's product.
 *
 * Layout (qlinear's layouts/exl3.py): trellis int16 [KT][NT][16 * bits] holds one 16x16 tile per (kt, nt) as a
 * cyclic bit stream read in 16-bit words with each pair swapped (word j ^ 1). The 16-bit state of stream position t
 * is the 16 stream bits ending with symbol t: bits [start, start + 16) with start = (t * bits + bits - 16) mod
 * (16 * 16 * bits); position t sits at tile row 2 (lane % 4) + (item % 2) + 8 ((item / 2) % 2), column lane / 4 +
 * 8 (item / 4), lane = t / 8, item = t % 8 (the tensor-core fragment order). The value of a state is table[state]
 * (the caller's float32 copy of the float16 codebook table: exact).
 *
 * exl3_decode writes out[kt * 16 + r][(nt - nt0) * 16 + c] for tiles nt0 <= nt < nt1: the values
 * layouts.exl3.inner_weight gives, bit for bit. Threads take whole rows of tiles (kt) in a fixed order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

/* Per tile element (row-major r * 16 + c): the two word indices of its state and the right shift. */
typedef struct {
    uint16_t w0[256], w1[256];
    uint8_t shift[256];
} exl3_plan;

static void make_plan(int bits, exl3_plan *p) {
    const int64_t nw = 16 * (int64_t)bits, len = nw * 16;
    for (int t = 0; t < 256; t++) {
        const int lane = t / 8, item = t % 8;
        const int r = 2 * (lane % 4) + (item % 2) + 8 * ((item / 2) % 2), c = lane / 4 + 8 * (item / 4);
        const int64_t start = (((int64_t)t * bits + bits - 16) % len + len) % len;
        const int64_t w = start / 16;
        const int e = r * 16 + c;
        p->w0[e] = (uint16_t)(w ^ 1);
        p->w1[e] = (uint16_t)(((w + 1) % nw) ^ 1);
        p->shift[e] = (uint8_t)(16 - start % 16);
    }
}

static void decode(const uint16_t *trellis, const float *table, float *out, int64_t kt_n, int64_t nt_n, int bits,
                   int64_t nt0, int64_t nt1, int64_t ldo, int threads, const exl3_plan *p) {
    const int64_t nw = 16 * (int64_t)bits;
#ifdef _OPENMP
#pragma omp parallel num_threads(ql_threads(threads, kt_n))
#endif
    {
        int64_t lo, hi;
        ql_thread_share(kt_n, &lo, &hi);
        for (int64_t kt = lo; kt < hi; kt++) {
            for (int64_t nt = nt0; nt < nt1; nt++) {
                const uint16_t *wd = trellis + (kt * nt_n + nt) * nw;
                float *tile = out + kt * 16 * ldo + (nt - nt0) * 16;
                for (int r = 0; r < 16; r++) {
                    float *row = tile + r * ldo;
                    for (int c = 0; c < 16; c++) {
                        const int e = r * 16 + c;
                        const uint32_t pair = ((uint32_t)wd[p->w0[e]] << 16) | wd[p->w1[e]];
                        row[c] = table[(pair >> p->shift[e]) & 0xFFFFu];
                    }
                }
            }
        }
    }
}

static PyObject *exl3_decode(PyObject *self, PyObject *args) {
    unsigned long long trellis, table, out;
    long long kt_n, nt_n, nt0, nt1, ldo;
    int bits, threads;
    exl3_plan plan;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLLiLLLi", &trellis, &table, &out, &kt_n, &nt_n, &bits, &nt0, &nt1, &ldo,
                          &threads))
        return NULL;
    if (!trellis || !table || !out) {
        PyErr_SetString(PyExc_ValueError, "exl3_decode: expected non-null trellis, table and out pointers");
        return NULL;
    }
    if (kt_n < 1 || nt_n < 1 || bits < 1 || bits > 8 || nt0 < 0 || nt1 <= nt0 || nt1 > nt_n ||
        ldo < (nt1 - nt0) * 16 || threads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "exl3_decode: expected KT, NT >= 1, bits 1..8, 0 <= nt0 < nt1 <= NT, ldo >= 16 (nt1 - nt0), "
                     "threads >= 1; got KT=%lld NT=%lld bits=%d nt0=%lld nt1=%lld ldo=%lld threads=%d",
                     kt_n, nt_n, bits, nt0, nt1, ldo, threads);
        return NULL;
    }
    make_plan(bits, &plan);
    Py_BEGIN_ALLOW_THREADS
    decode((const uint16_t *)(uintptr_t)trellis, (const float *)(uintptr_t)table, (float *)(uintptr_t)out, kt_n,
           nt_n, bits, nt0, nt1, ldo, threads, &plan);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"exl3_decode", exl3_decode, METH_VARARGS,
     "exl3_decode(trellis, table, out, KT, NT, bits, nt0, nt1, ldo, threads): tiles nt0..nt1-1 of the EXL3 inner "
     "weight into out [16 KT, ldo] float32 (table: the codebook's 65536 values as float32); pointers as integers"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_exl3", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__exl3(void) { return PyModule_Create(&MODULE); }

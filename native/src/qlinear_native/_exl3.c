/* Python bindings of qlinear's native EXL3 kernels (qlinear_native._exl3): argument checks, the GIL released around
 * the kernels. Pointers are passed as integers (tensor data_ptr()); layout and arithmetic in exl3.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include <string.h>

#include "exl3.h"

/* "3inst", "mcg", "mul1" (computed) or "table" (looked up) into *cb; 0 with a Python error naming the call. */
static int codebook_of(const char *name, const char *s, exl3_codebook *cb) {
    if (!strcmp(s, "3inst"))
        *cb = EXL3_3INST;
    else if (!strcmp(s, "mcg"))
        *cb = EXL3_MCG;
    else if (!strcmp(s, "mul1"))
        *cb = EXL3_MUL1;
    else if (!strcmp(s, "table"))
        *cb = EXL3_TABLE;
    else {
        PyErr_Format(PyExc_ValueError, "%s: expected codebook '3inst', 'mcg', 'mul1' or 'table', got '%s'", name, s);
        return 0;
    }
    return 1;
}

static PyObject *exl3_decode(PyObject *self, PyObject *args) {
    unsigned long long trellis, table, out;
    long long kt_n, nt_n, nt0, nt1, ldo;
    int bits, threads;
    const char *codebook;
    exl3_codebook cb;
    exl3_plan plan;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLLiLLLis", &trellis, &table, &out, &kt_n, &nt_n, &bits, &nt0, &nt1, &ldo,
                          &threads, &codebook) || !codebook_of("exl3_decode", codebook, &cb))
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
    exl3_make_plan(bits, cb, &plan);
    Py_BEGIN_ALLOW_THREADS
    exl3_decode_tiles((const uint16_t *)(uintptr_t)trellis, (const float *)(uintptr_t)table,
                      (float *)(uintptr_t)out, kt_n, nt_n, nt0, nt1, ldo, threads, &plan);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *exl3_mv_call(PyObject *self, PyObject *args) {
    unsigned long long trellis, table, x, y;
    long long m, kt_n, nt_n;
    int bits, threads;
    const char *codebook;
    exl3_codebook cb;
    exl3_plan plan;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKLLLiis", &trellis, &table, &x, &y, &m, &kt_n, &nt_n, &bits, &threads,
                          &codebook) || !codebook_of("exl3_mv", codebook, &cb))
        return NULL;
    if (!trellis || !table || !x || !y) {
        PyErr_SetString(PyExc_ValueError, "exl3_mv: expected non-null trellis, table, x and y pointers");
        return NULL;
    }
    if (m < 1 || kt_n < 1 || nt_n < 1 || bits < 1 || bits > 8 || threads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "exl3_mv: expected M, KT, NT >= 1, bits 1..8, threads >= 1; got M=%lld KT=%lld NT=%lld "
                     "bits=%d threads=%d", m, kt_n, nt_n, bits, threads);
        return NULL;
    }
    exl3_make_plan(bits, cb, &plan);
    Py_BEGIN_ALLOW_THREADS
    exl3_mv((const uint16_t *)(uintptr_t)trellis, (const float *)(uintptr_t)table, (const float *)(uintptr_t)x,
            (float *)(uintptr_t)y, m, kt_n, nt_n, threads, &plan);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"exl3_decode", exl3_decode, METH_VARARGS,
     "exl3_decode(trellis, table, out, KT, NT, bits, nt0, nt1, ldo, threads, codebook): tiles nt0..nt1-1 of the "
     "EXL3 inner weight into out [16 KT, ldo] float32 (table: the codebook's 65536 values as float32, used where "
     "the codebook's values are not computed: codebook 'table', or no AVX-512); pointers as integers"},
    {"exl3_mv", exl3_mv_call, METH_VARARGS,
     "exl3_mv(trellis, table, x, y, M, KT, NT, bits, threads, codebook): y [M, 16 NT] = x [M, 16 KT] (float32, contiguous) "
     "times the EXL3 inner weight, decoded tile by tile and never stored; pointers as integers"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_exl3", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__exl3(void) { return PyModule_Create(&MODULE); }

/* Python bindings of qlinear's native 4-bit look-up-table weight kernels (qlinear_native._lut4: bitsandbytes NF4 /
 * FP4): argument checks, the GIL released around the kernels. Pointers are passed as integers (tensor
 * data_ptr()); layout and arithmetic in lut4.h, lut4_mv.c (AVX-512, any M) and lut4_mm.c (AMX tiles). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "lut4.h"

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(q4_mv_ready());
}

static PyObject *amx_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(q4_amx_ready());
}

/* Parse and check one call's arguments into *c; 0 with a Python error on failure. */
static int parse(PyObject *args, int amx, q4_call *c) {
    const char *name = amx ? "lut4_mm" : "lut4_mv", *dtype;
    unsigned long long x, codes, absmax, table, out;
    long long m, k, n, blk, ldx, ldo;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLLsi", &x, &codes, &absmax, &table, &out, &m, &k, &n, &blk, &ldx, &ldo,
                          &dtype, &c->threads))
        return 0;
    if (!(amx ? q4_amx_ready() : q4_mv_ready())) {
        PyErr_Format(PyExc_RuntimeError, "%s: this CPU or OS offers no %s", name,
                     amx ? "AMX-BF16 tiles with AVX-512" : "AVX-512 (F, BW, DQ, VL)");
        return 0;
    }
    if (!strcmp(dtype, "float32") && !amx)
        c->x_f32 = 1;
    else if (!strcmp(dtype, "bfloat16"))
        c->x_f32 = 0;
    else {
        PyErr_Format(PyExc_ValueError, "%s: expected dtype %s, got '%s'", name,
                     amx ? "'bfloat16'" : "'bfloat16' or 'float32'", dtype);
        return 0;
    }
    if (c->threads < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected threads >= 1, got %d", name, c->threads);
        return 0;
    }
    if (!x || !codes || !absmax || !table || !out) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected non-null pointers, got x=%llu codes=%llu absmax=%llu table=%llu out=%llu", name, x,
                     codes, absmax, table, out);
        return 0;
    }
    if (m <= 0 || k <= 0 || n <= 0 || blk <= 0 || blk % 32 || k % blk || ldx < k || ldo < n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected M > 0, N > 0, block %% 32 == 0, K %% block == 0, ldx >= K, ldo >= N; got M=%lld "
                     "K=%lld N=%lld block=%lld ldx=%lld ldo=%lld",
                     name, m, k, n, blk, ldx, ldo);
        return 0;
    }
    if (n * (k / blk) > 0x7FFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "%s: expected fewer than 2**31 absmax values, got N=%lld x %lld blocks", name,
                     n, k / blk);
        return 0;
    }
    c->x = (const void *)(uintptr_t)x;
    c->codes = (const uint8_t *)(uintptr_t)codes;
    c->absmax = (const float *)(uintptr_t)absmax;
    c->table = (const float *)(uintptr_t)table;
    c->out = (void *)(uintptr_t)out;
    c->m = m;
    c->k = k;
    c->n = n;
    c->block = blk;
    c->ldx = ldx;
    c->ldo = ldo;
    return 1;
}

static PyObject *run(PyObject *args, int amx) {
    q4_call c;
    if (!parse(args, amx, &c))
        return NULL;
#if QL_X86
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = amx ? q4_mm(&c) : q4_mv(&c);
    Py_END_ALLOW_THREADS
    if (rc)
        return PyErr_NoMemory();
#endif
    Py_RETURN_NONE;
}

static PyObject *lut4_mv(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 0);
}

static PyObject *lut4_mm(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 1);
}

#define DOC                                                                                                       \
    "(x, codes, absmax, table, out, m, k, n, block, ldx, ldo, dtype, threads): out[M, N] = x @ W^T, "             \
    "W[n, k] = table[c(n, k)] * absmax[n, k / block]; codes uint8 [N, K/2] (byte j: c(n, 2j) in the high nibble, " \
    "c(n, 2j + 1) in the low one), absmax float32 [N, K/block], table float32 [16], x and out of dtype "          \
    "[M, ldx] / [M, ldo]; block % 32 == 0, K % block == 0"

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "True when this CPU and OS run lut4_mv (AVX-512 F, BW, DQ, VL)"},
    {"amx_available", amx_available, METH_NOARGS, "True when this CPU and OS run lut4_mm (AMX-BF16 tiles)"},
    {"lut4_mv", lut4_mv, METH_VARARGS,
     "lut4_mv" DOC "; dtype 'bfloat16' or 'float32'; AVX-512 float32 FMAs, the choice for small M"},
    {"lut4_mm", lut4_mm, METH_VARARGS, "lut4_mm" DOC "; dtype 'bfloat16'; AMX tiles, for larger M"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lut4", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lut4(void) { return PyModule_Create(&module); }

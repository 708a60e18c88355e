/* Python binding of the GGUF block kernel (qlinear_native._blocks): argument checks, the GIL released around
 * it. Pointers are passed as integers (tensor data_ptr()); the layouts are in blocks.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "blocks.h"

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ql_blocks_ready());
}

static PyObject *mm(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    unsigned long long x, xs, w, out;
    long long m, k, n, ldx, ldo;
    int threads;
    if (!PyArg_ParseTuple(args, "sKKKKLLLLLi", &name, &x, &xs, &w, &out, &m, &k, &n, &ldx, &ldo, &threads))
        return NULL;
    ql_block t;
    if (!strcmp(name, "Q8_0"))
        t = QL_Q8_0;
    else if (!strcmp(name, "Q4_0"))
        t = QL_Q4_0;
    else if (!strcmp(name, "Q4_1"))
        t = QL_Q4_1;
    else if (!strcmp(name, "Q4_K"))
        t = QL_Q4_K;
    else if (!strcmp(name, "Q6_K"))
        t = QL_Q6_K;
    else {
        PyErr_Format(PyExc_ValueError, "blocks mm: expected a block type Q8_0, Q4_0, Q4_1, Q4_K or Q6_K, got %s", name);
        return NULL;
    }
    if (!ql_blocks_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "blocks mm: this CPU or OS offers no AVX-512F with F16C");
        return NULL;
    }
    if (m <= 0 || k <= 0 || k % (t == QL_Q4_K || t == QL_Q6_K ? 256 : 32) || n <= 0 || ldx < k || ldo < n || threads < 1 || (t != QL_Q8_0 && t != QL_Q6_K && !xs)) {
        PyErr_Format(PyExc_ValueError,
                     "blocks mm: expected M > 0, K %% 32 == 0 (K-quants: %% 256), N > 0, ldx >= K, ldo >= N, threads >= 1 and block sums "
                     "of x for Q4_0/Q4_1/Q4_K; got M=%lld K=%lld N=%lld ldx=%lld ldo=%lld threads=%d", m, k, n, ldx, ldo,
                     threads);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ql_blocks_mm(t, (const float *)(uintptr_t)x, ldx, (const float *)(uintptr_t)xs, (const uint8_t *)(uintptr_t)w,
                 (float *)(uintptr_t)out, ldo, m, k, n, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "True when this CPU and OS run the block kernel (AVX-512F, F16C)"},
    {"mm", mm, METH_VARARGS,
     "mm(qtype, x, xsums, blocks, out, m, k, n, ldx, ldo, threads): out = x @ W^T in float32, W the blocks "
     "of qtype (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) as in the file, xsums [M, K/32] each block's sum of x"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blocks", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__blocks(void) { return PyModule_Create(&module); }

/* Python bindings of qlinear's native FP8 / FP4 weight kernels (qlinear_native._float): argument checks, the
 * GIL released around the kernels. Pointers are passed as integers (tensor data_ptr()); layouts, values and
 * arithmetic in float8.h, float8_mv.c (AVX-512, any M) and float8_amx.c (AMX tiles, larger M). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "float8.h"

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(qf_mv_ready());
}

static PyObject *amx_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(qf_amx_ready());
}

typedef enum { FP8_MV, FP8_MM, FP4_MV, FP4_MM } kernel_id;
static const char *names[] = {"fp8_mv", "fp8_mm", "fp4_mv", "fp4_mm"};

/* Parse and check one call's arguments into *c; 0 with a Python error on failure. */
static int parse(PyObject *args, kernel_id id, qf_call *c) {
    const char *name = names[id], *fmt, *dtype;
    unsigned long long x, w, s, out;
    long long m, k, n, blk = 0, ldx, ldo;
    float g = 1.0f;
    const int fp8 = id == FP8_MV || id == FP8_MM;
    int ok = fp8 ? PyArg_ParseTuple(args, "KKKKLLLLLLssi", &x, &w, &s, &out, &m, &k, &n, &blk, &ldx, &ldo, &fmt,
                                    &dtype, &c->threads)
                 : PyArg_ParseTuple(args, "KKKKLLLfLLssi", &x, &w, &s, &out, &m, &k, &n, &g, &ldx, &ldo, &fmt, &dtype,
                                    &c->threads);
    if (!ok)
        return 0;
    const int amx = id == FP8_MM || id == FP4_MM;
    if (!(amx ? qf_amx_ready() : qf_mv_ready())) {
        PyErr_Format(PyExc_RuntimeError, "%s: this CPU or OS offers no %s", name,
                     amx ? "AMX-BF16 tiles with AVX-512 VBMI" : "AVX-512 (F, BW, DQ, VL) with VBMI");
        return 0;
    }
    if (fp8 && !strcmp(fmt, "e4m3fn"))
        c->fmt = QF_E4M3;
    else if (fp8 && !strcmp(fmt, "e5m2"))
        c->fmt = QF_E5M2;
    else if (!fp8 && !strcmp(fmt, "nvfp4"))
        c->fmt = QF_NVFP4, blk = 16;
    else if (!fp8 && !strcmp(fmt, "mxfp4"))
        c->fmt = QF_MXFP4, blk = 32;
    else {
        PyErr_Format(PyExc_ValueError, "%s: expected format %s, got '%s'", name,
                     fp8 ? "'e4m3fn' or 'e5m2'" : "'nvfp4' or 'mxfp4'", fmt);
        return 0;
    }
    if (!strcmp(dtype, "float32") || !strcmp(dtype, "bfloat16"))
        c->out_bf16 = dtype[0] == 'b';
    else {
        PyErr_Format(PyExc_ValueError, "%s: expected out_dtype 'float32' or 'bfloat16', got '%s'", name, dtype);
        return 0;
    }
    if (c->threads < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected threads >= 1, got %d", name, c->threads);
        return 0;
    }
    if (!x || !w || !s || !out) {
        PyErr_Format(PyExc_ValueError, "%s: expected non-null pointers, got x=%llu w=%llu scale=%llu out=%llu", name,
                     x, w, s, out);
        return 0;
    }
    if (m <= 0 || k <= 0 || k % 32 || n <= 0 || ldx < k || ldo < n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected M > 0, K > 0 with K %% 32 == 0, N > 0, ldx >= K, ldo >= N; got M=%lld K=%lld N=%lld "
                     "ldx=%lld ldo=%lld",
                     name, m, k, n, ldx, ldo);
        return 0;
    }
    if (fp8 && (blk <= 0 || (blk % 32 && blk < k))) {
        PyErr_Format(PyExc_ValueError, "%s: expected bk %% 32 == 0 or bk >= K (one block), got bk=%lld with K=%lld",
                     name, blk, k);
        return 0;
    }
    if (fp8 && n * ((k + (blk < k ? blk : k) - 1) / (blk < k ? blk : k)) > 0x7FFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "%s: expected fewer than 2**31 scales, got N=%lld x %lld blocks", name, n,
                     (k + blk - 1) / blk);
        return 0;
    }
    c->x = (const uint16_t *)(uintptr_t)x;
    c->w = (const uint8_t *)(uintptr_t)w;
    c->scale = (const void *)(uintptr_t)s;
    c->out = (void *)(uintptr_t)out;
    c->m = m;
    c->k = k;
    c->n = n;
    c->blk = blk;
    c->ldx = ldx;
    c->ldo = ldo;
    c->g = g;
    return 1;
}

static PyObject *run(PyObject *args, kernel_id id) {
    qf_call c;
    if (!parse(args, id, &c))
        return NULL;
#if QL_X86
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = id == FP8_MV ? qf_fp8_mv(&c) : id == FP8_MM ? qf_fp8_amx(&c) : id == FP4_MV ? qf_fp4_mv(&c) : qf_fp4_amx(&c);
    Py_END_ALLOW_THREADS
    if (rc)
        return PyErr_NoMemory();
#endif
    Py_RETURN_NONE;
}

static PyObject *fp8_mv(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, FP8_MV);
}

static PyObject *fp8_mm(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, FP8_MM);
}

static PyObject *fp4_mv(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, FP4_MV);
}

static PyObject *fp4_mm(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, FP4_MM);
}

#define FP8_DOC                                                                                                   \
    "(x, w8, scale, out, m, k, n, bk, ldx, ldo, fmt, out_dtype, threads): out[m, n] = x @ W^T, x bfloat16 [M, ldx], " \
    "w8 uint8 [N, K] float8 bytes of fmt 'e4m3fn' or 'e5m2', scale float32 [N, ceil(K/bk)] (bk % 32 == 0, or >= K "   \
    "for one scale per channel), out_dtype 'float32' or 'bfloat16' [M, ldo]; K % 32 == 0"
#define FP4_DOC                                                                                                   \
    "(x, packed, scales, out, m, k, n, g, ldx, ldo, fmt, out_dtype, threads): out = g * x @ W^T, packed uint8 "       \
    "[N, K/2] E2M1 nibbles (low = even column), scales uint8 [N, K/bs]: fmt 'nvfp4' (bs 16, e4m3fn) or 'mxfp4' (bs " \
    "32, E8M0, 255 = NaN); K % 32 == 0"

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "True when this CPU and OS run the AVX-512 kernels (fp8_mv, fp4_mv)"},
    {"amx_available", amx_available, METH_NOARGS, "True when this CPU and OS run the AMX kernels (fp8_mm, fp4_mm)"},
    {"fp8_mv", fp8_mv, METH_VARARGS, "fp8_mv" FP8_DOC "; AVX-512, the choice for small M"},
    {"fp8_mm", fp8_mm, METH_VARARGS, "fp8_mm" FP8_DOC "; AMX tiles, for larger M"},
    {"fp4_mv", fp4_mv, METH_VARARGS, "fp4_mv" FP4_DOC "; AVX-512, the choice for small M"},
    {"fp4_mm", fp4_mm, METH_VARARGS, "fp4_mm" FP4_DOC "; AMX tiles, for larger M"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_float", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__float(void) {
    qf_init();
    return PyModule_Create(&module);
}

/* Python bindings of qlinear's native VPTQ kernels (qlinear_native._vq): argument checks, the GIL released around
 * the kernels. Pointers are passed as integers (tensor data_ptr()); layout and arithmetic in vq.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "vq.h"

/* A codebook dtype's name into c->dt; 0 with a Python error naming the call on failure. */
static int parse_dtype(const char *name, const char *dtype, vq_call *c) {
    if (!strcmp(dtype, "float16"))
        c->dt = VQ_F16;
    else if (!strcmp(dtype, "bfloat16"))
        c->dt = VQ_BF16;
    else if (!strcmp(dtype, "float32"))
        c->dt = VQ_F32;
    else {
        PyErr_Format(PyExc_ValueError, "%s: expected codebook dtype 'float16', 'bfloat16' or 'float32', got '%s'",
                     name, dtype);
        return 0;
    }
    return 1;
}

/* The fields both calls share, checked, into *c; 0 with a Python error naming the call on failure. */
static int common(const char *name, vq_call *c, unsigned long long idx, unsigned long long cb, unsigned long long rcb,
                  long long g, long long j, long long w, long long gs, long long kmain, int v, int cbits, int rbits,
                  const char *dtype, int threads) {
    if (!parse_dtype(name, dtype, c))
        return 0;
    if (!idx || !cb || (rbits && !rcb)) {
        PyErr_Format(PyExc_ValueError, "%s: expected non-null indices and codebook (and residual codebook when "
                     "rbits > 0)", name);
        return 0;
    }
    if (v < 1 || v > VQ_MAX_V || g < 1 || j < 1 || gs < 1 || kmain < 1 || kmain > g * gs || cbits < 1 ||
        cbits > 24 || rbits < 0 || rbits > 24 || cbits + rbits > 32 || w * 32 < gs * (cbits + rbits) || threads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected 1 <= V <= %d, G, J, gs >= 1, 1 <= Kmain <= G * gs, codebook bits 1..24 (+ residual "
                     "0..24, at most 32), W * 32 >= gs * bits, threads >= 1; got V=%d G=%lld J=%lld gs=%lld "
                     "Kmain=%lld bits=%d+%d W=%lld threads=%d",
                     name, VQ_MAX_V, v, g, j, gs, kmain, cbits, rbits, w, threads);
        return 0;
    }
    c->idx = (const uint32_t *)(uintptr_t)idx;
    c->cb = (const void *)(uintptr_t)cb;
    c->rcb = rbits ? (const void *)(uintptr_t)rcb : NULL;
    c->x = c->xt = NULL, c->y = NULL;
    c->g = g, c->j = j, c->w = w, c->gs = gs, c->kmain = kmain;
    c->v = v, c->cbits = cbits, c->rbits = rbits, c->threads = threads;
    return 1;
}

static PyObject *vq_decode(PyObject *self, PyObject *args) {
    unsigned long long idx, cb, rcb, out;
    long long g, j, w, gs, kmain, j0, j1, ldo;
    int v, cbits, rbits, threads;
    const char *dtype;
    vq_call c;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKLLLLLLLLiiisi", &idx, &cb, &rcb, &out, &g, &j, &w, &gs, &kmain, &j0, &j1, &ldo,
                          &v, &cbits, &rbits, &dtype, &threads) ||
        !common("vq_decode", &c, idx, cb, rcb, g, j, w, gs, kmain, v, cbits, rbits, dtype, threads))
        return NULL;
    if (!out || j0 < 0 || j1 <= j0 || j1 > j || ldo < (j1 - j0) * v) {
        PyErr_Format(PyExc_ValueError, "vq_decode: expected a non-null out, 0 <= j0 < j1 <= J, ldo >= (j1 - j0) V; "
                     "got out=%llu j0=%lld j1=%lld J=%lld ldo=%lld V=%d", out, j0, j1, j, ldo, v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    vq_decode_cols(&c, j0, j1, (uint16_t *)(uintptr_t)out, ldo);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *vq_mv(PyObject *self, PyObject *args) {
    unsigned long long idx, cb, rcb, x, y;
    long long m, g, j, w, gs, kmain, ldx, ldy;
    int v, cbits, rbits, threads;
    const char *dtype;
    vq_call c;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLLLLiiisi", &idx, &cb, &rcb, &x, &y, &m, &g, &j, &w, &gs, &kmain, &ldx,
                          &ldy, &v, &cbits, &rbits, &dtype, &threads) ||
        !common("vq_mv", &c, idx, cb, rcb, g, j, w, gs, kmain, v, cbits, rbits, dtype, threads))
        return NULL;
    if (!x || !y || m < 1 || m > vq_max_rows(&c) || ldx < kmain || ldy < j * v) {
        PyErr_Format(PyExc_ValueError, "vq_mv: expected non-null x and y, 1 <= M <= %d, ldx >= Kmain, ldy >= J * V; "
                     "got x=%llu y=%llu M=%lld ldx=%lld Kmain=%lld ldy=%lld J=%lld V=%d",
                     vq_max_rows(&c), x, y, m, ldx, kmain, ldy, j, v);
        return NULL;
    }
    c.x = (const float *)(uintptr_t)x;
    c.y = (float *)(uintptr_t)y;
    c.m = m, c.ldx = ldx, c.ldy = ldy;
    float *xt = NULL;
    if (vq_columns(&c)) {  /* x's columns, Kmain M floats (a few hundred kB at most) */
        xt = PyMem_RawMalloc((size_t)(kmain * m) * sizeof(float));
        if (!xt)
            return PyErr_NoMemory();
        for (long long k = 0; k < kmain; k++)
            for (long long r = 0; r < m; r++)
                xt[k * m + r] = c.x[r * ldx + k];
    }
    c.xt = xt;
    Py_BEGIN_ALLOW_THREADS
    vq_run(&c);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(xt);
    Py_RETURN_NONE;
}

static PyObject *max_m(PyObject *self, PyObject *args) {
    int v;
    const char *dtype;
    vq_call c;
    (void)self;
    if (!PyArg_ParseTuple(args, "is", &v, &dtype) || !parse_dtype("max_m", dtype, &c))
        return NULL;
    c.v = v;
    return PyLong_FromLong(vq_max_rows(&c));
}

static PyMethodDef METHODS[] = {
    {"vq_mv", vq_mv, METH_VARARGS,
     "vq_mv(indices, codebook, residual, x, y, M, G, J, W, gs, Kmain, ldx, ldy, V, cbits, rbits, dtype, threads): "
     "y[M, J*V] (float32) = x[M, Kmain] (float32) times the VPTQ weight; pointers as integers"},
    {"vq_decode", vq_decode, METH_VARARGS,
     "vq_decode(indices, codebook, residual, out, G, J, W, gs, Kmain, j0, j1, ldo, V, cbits, rbits, dtype, threads): "
     "vectors j0..j1-1 of the main weight into out [Kmain, ldo] (bfloat16, transposed); pointers as integers"},
    {"max_m", max_m, METH_VARARGS,
     "max_m(V, dtype): the most activation rows one vq_mv call takes for that vector length and codebook dtype"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_vq", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__vq(void) { return PyModule_Create(&MODULE); }

/* Python bindings of qlinear's native int4 kernels (qlinear_native._int4): argument checks, the GIL released
 * around the kernels. Pointers are passed as integers (tensor data_ptr()); layout and values in int4.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "int4.h"

static PyObject *amx_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ql_amx_ready());
}

static PyObject *mv_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ql_mv_ready());
}

static PyObject *dp_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ql_dp_ready());
}

#define INT4_ARGS "KKKKLLLLLLi"
#define INT4_DOC "(x, packed, scales_zeros, out, m, k, n, group, ldx, ldo, threads"

typedef struct {
    unsigned long long x, packed, sz, out;
    long long m, k, n, group, ldx, ldo;
    int threads;
} int4_args;

/* Parse and check the shared arguments (plus `extra` trailing long longs, and with `flag` an optional trailing
 * bool); 0 with a Python error on failure. */
static int parse(PyObject *args, int4_args *a, const char *name, int ready, const char *missing, int group_mod,
                 long long *extra, int n_extra, int *flag) {
    int ok = flag      ? PyArg_ParseTuple(args, INT4_ARGS "LL|p", &a->x, &a->packed, &a->sz, &a->out, &a->m, &a->k,
                                          &a->n, &a->group, &a->ldx, &a->ldo, &a->threads, &extra[0], &extra[1], flag)
             : n_extra ? PyArg_ParseTuple(args, INT4_ARGS "LL", &a->x, &a->packed, &a->sz, &a->out, &a->m, &a->k, &a->n,
                                          &a->group, &a->ldx, &a->ldo, &a->threads, &extra[0], &extra[1])
                       : PyArg_ParseTuple(args, INT4_ARGS, &a->x, &a->packed, &a->sz, &a->out, &a->m, &a->k, &a->n,
                                          &a->group, &a->ldx, &a->ldo, &a->threads);
    if (!ok)
        return 0;
    if (!ready) {
        PyErr_Format(PyExc_RuntimeError, "%s: this CPU or OS offers no %s", name, missing);
        return 0;
    }
    if (a->threads < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected threads >= 1, got %d", name, a->threads);
        return 0;
    }
    if (a->m <= 0 || a->k <= 0 || a->k % 32 || a->n <= 0 || a->n % 64 || a->group <= 0 || a->group % group_mod ||
        a->k % a->group || a->ldx < a->k || a->ldo < a->n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected M > 0, K %% 32 == 0, N %% 64 == 0, group %% %d == 0 dividing K, ldx >= K, ldo >= N; "
                     "got M=%lld K=%lld N=%lld group=%lld ldx=%lld ldo=%lld",
                     name, group_mod, a->m, a->k, a->n, a->group, a->ldx, a->ldo);
        return 0;
    }
    return 1;
}

#define PTRS(a)                                                                                                  \
    (const uint16_t *)(uintptr_t)(a).x, (a).ldx, (const uint8_t *)(uintptr_t)(a).packed,                          \
        (const uint16_t *)(uintptr_t)(a).sz, (uint16_t *)(uintptr_t)(a).out, (a).ldo, (a).m, (a).k, (a).n, (a).group, \
        (a).threads

typedef enum { MM_CODES, MM_WEIGHTS, MV, MM_DP } kernel_id;

/* One binding for the four kernels: parse and check, then run with the GIL released. */
static PyObject *run(PyObject *args, kernel_id id) {
    static const char *names[] = {"int4_mm_codes", "int4_mm_weights", "int4_mv", "int4_mm_dp"};
    int4_args a;
    long long chunk[2] = {0, 0};
    int vbmi = ql_mv_ready(); /* int4_mm_dp's decode: VPERMI2B where the CPU has VBMI, unless told not to */
    const int amx = id == MM_CODES || id == MM_WEIGHTS, chunked = id == MM_WEIGHTS || id == MM_DP;
    if (!parse(args, &a, names[id], amx ? ql_amx_ready() : id == MM_DP ? ql_dp_ready() : ql_mv_ready(),
               amx ? "AMX-BF16 tiles" : id == MM_DP ? "AVX512-BF16 (F, BW, VL)" : "AVX512-BF16 with AVX512-VBMI",
               id == MM_CODES ? 32 : id == MV ? 16 : 2, chunk, chunked ? 2 : 0, id == MM_DP ? &vbmi : NULL))
        return NULL;
    if (id == MM_DP && vbmi && !ql_mv_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "int4_mm_dp: vbmi=True asks for the VPERMI2B decode, and this CPU has no "
                                            "AVX512-VBMI (pass vbmi=False)");
        return NULL;
    }
    if (chunked && (chunk[0] <= 0 || chunk[0] % 64 || chunk[1] <= 0 || chunk[1] % 32)) {
        PyErr_Format(PyExc_ValueError, "%s: expected ng %% 64 == 0 and kc %% 32 == 0, got ng=%lld kc=%lld", names[id],
                     chunk[0], chunk[1]);
        return NULL;
    }
#if QL_X86
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = id == MM_CODES     ? ql_amx_mm_codes(PTRS(a))
         : id == MM_WEIGHTS ? ql_amx_mm_weights(PTRS(a), chunk[0], chunk[1])
         : id == MM_DP      ? ql_dp_mm(PTRS(a), chunk[0], chunk[1], vbmi)
                            : ql_mv(PTRS(a));
    Py_END_ALLOW_THREADS
    if (rc)
        return PyErr_NoMemory();
#endif
    Py_RETURN_NONE;
}

static PyObject *int4_mm_codes(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, MM_CODES);
}

static PyObject *int4_mm_weights(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, MM_WEIGHTS);
}

static PyObject *int4_mv(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, MV);
}

static PyObject *int4_mm_dp(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, MM_DP);
}

static PyMethodDef methods[] = {
    {"amx_available", amx_available, METH_NOARGS, "True when this CPU and OS let the process use AMX-BF16 tiles"},
    {"mv_available", mv_available, METH_NOARGS, "True when this CPU has AVX512-BF16 and AVX512-VBMI"},
    {"dp_available", dp_available, METH_NOARGS, "True when this CPU has AVX512-BF16 (int4_mm_dp; VBMI not needed)"},
    {"int4_mm_codes", int4_mm_codes, METH_VARARGS,
     "int4_mm_codes" INT4_DOC "): out = bf16(x @ W) on AMX, exact codes in the tiles, scales applied per group"},
    {"int4_mm_weights", int4_mm_weights, METH_VARARGS,
     "int4_mm_weights" INT4_DOC ", ng, kc): the same with the weight decoded with its scales in ng x kc chunks"},
    {"int4_mv", int4_mv, METH_VARARGS,
     "int4_mv" INT4_DOC "): the same with AVX512-BF16 dot products, for one or two rows at a time"},
    {"int4_mm_dp", int4_mm_dp, METH_VARARGS,
     "int4_mm_dp" INT4_DOC ", ng, kc[, vbmi]): AVX512-BF16 dot products without AMX, the weight decoded once in "
     "ng x kc chunks (with VPERMI2B where vbmi, default: where the CPU has VBMI; else with AVX512-BW unpacks)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int4", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__int4(void) { return PyModule_Create(&module); }

/* Python binding of the GGUF Q8_0 kernel (qlinear_native._q8): argument checks, the GIL released around it.
 * Pointers are passed as integers (tensor data_ptr()); the layout is in q8_0.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

int ql_q8_ready(void);
void ql_q8_0_mm(const float *x, long long ldx, const uint8_t *w, float *out, long long ldo, long long m,
                long long k, long long n, int threads);

static PyObject *q8_0_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(ql_q8_ready());
}

static PyObject *q8_0_mm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, w, out;
    long long m, k, n, ldx, ldo;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKLLLLLi", &x, &w, &out, &m, &k, &n, &ldx, &ldo, &threads))
        return NULL;
    if (!ql_q8_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "q8_0_mm: this CPU or OS offers no AVX-512F with F16C");
        return NULL;
    }
    if (m <= 0 || k <= 0 || k % 32 || n <= 0 || ldx < k || ldo < n || threads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "q8_0_mm: expected M > 0, K %% 32 == 0, N > 0, ldx >= K, ldo >= N, threads >= 1; "
                     "got M=%lld K=%lld N=%lld ldx=%lld ldo=%lld threads=%d", m, k, n, ldx, ldo, threads);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ql_q8_0_mm((const float *)(uintptr_t)x, ldx, (const uint8_t *)(uintptr_t)w, (float *)(uintptr_t)out, ldo, m, k,
               n, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"q8_0_available", q8_0_available, METH_NOARGS, "True when this CPU and OS run the Q8_0 kernel (AVX-512F, F16C)"},
    {"q8_0_mm", q8_0_mm, METH_VARARGS,
     "q8_0_mm(x, blocks, out, m, k, n, ldx, ldo, threads): out = x @ W^T in float32, W the Q8_0 blocks "
     "[N, K/32 * 34] as in the file"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_q8", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__q8(void) { return PyModule_Create(&module); }

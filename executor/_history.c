/* The history features' bins of many sessions' newest observations at once, in C (see
 * executor.history.HistoryRing.newest, whose numpy pass is the reference: the same bounds, the same
 * float64 sums newest first from +0.0 and the same divisions, so the same bits).
 *
 * bins(buf, t, slots, newest, begin, delays, pair_bin, pair_series, limits, value, ok, lead):
 *   buf (slots, size + 1, W) float64 and t (slots, size) int64: the ring (observation j of a slot at
 *   place j % size; its last column the lead flag); per row its slot, the absolute index of its newest
 *   observation and of the first within the horizon (fewer than `size` apart); delays (B,) int64 ns,
 *   0 first; the (bin, series) pairs to sum; limits (TOL, BIN, GAP, K) int64. Writes value (rows, P)
 *   float64, ok (rows, B) bool (past(e) ok) and lead (rows, B) float64 (the lead flag of each bin's
 *   last observation). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* a C-contiguous buffer of items of `itemsize` bytes whose format is `kind` ("d", "q" or "?") */
static int take(PyObject *obj, Py_buffer *b, const char *name, Py_ssize_t itemsize, const char *kind, int writable) {
    int want = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, want) < 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '=' || *f == '<' || *f == '@') f++;
    int ok = b->itemsize == itemsize && (strcmp(f, kind) == 0 || (itemsize == 8 && kind[0] == 'q' && strcmp(f, "l") == 0));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous %s array", name,
                     kind[0] == 'd' ? "float64" : kind[0] == '?' ? "bool" : "int64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* the first absolute index j in [lo, hi) whose timestamp relative to the newest is above q
 * (bisect_right over the window, which is in time order) */
static int64_t after(const int64_t *ts, int64_t size, int64_t t_now, int64_t lo, int64_t hi, int64_t q) {
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ts[mid % size] - t_now <= q)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

enum { N_ARGS = 12, MAX_BINS = 64 };

static PyObject *bins(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_ARGS) {
        PyErr_Format(PyExc_TypeError, "bins() takes %d arguments (%zd given)", N_ARGS, nargs);
        return NULL;
    }
    static const char *names[N_ARGS] = {"buf",      "t",           "slots",  "newest", "begin", "delays",
                                        "pair_bin", "pair_series", "limits", "value",  "ok",    "lead"};
    static const char *kinds[N_ARGS] = {"d", "q", "q", "q", "q", "q", "q", "q", "q", "d", "?", "d"};
    static const Py_ssize_t sizes[N_ARGS] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 1, 8};
    Py_buffer b[N_ARGS];
    int got = 0;
    PyObject *result = NULL;
    for (; got < N_ARGS; got++)
        if (take(args[got], &b[got], names[got], sizes[got], kinds[got], got >= 9) < 0) goto done;
    Py_ssize_t rows = b[2].len / 8, n_bins = b[5].len / 8, n_pairs = b[6].len / 8;
    if (b[1].ndim != 2 || b[0].ndim != 3 || b[0].shape[0] != b[1].shape[0] || b[0].shape[1] != b[1].shape[1] + 1) {
        PyErr_SetString(PyExc_ValueError, "buf (slots, size + 1, W) and t (slots, size): one ring");
        goto done;
    }
    const int64_t n_slots = b[1].shape[0], size = b[1].shape[1], width = b[0].shape[2];
    if (b[3].len != rows * 8 || b[4].len != rows * 8 || b[7].len != n_pairs * 8 || b[8].len != 4 * 8 ||
        b[9].len != rows * n_pairs * 8 || b[10].len != rows * n_bins || b[11].len != rows * n_bins * 8 ||
        n_bins < 1 || n_bins > MAX_BINS || size < 1) {
        PyErr_SetString(PyExc_ValueError, "slots, newest, begin (rows,); pair_bin, pair_series (P,); limits (4,); "
                                          "value (rows, P), ok and lead (rows, B)");
        goto done;
    }
    const double *buf = b[0].buf;
    const int64_t *t = b[1].buf, *slots = b[2].buf, *newest = b[3].buf, *begin = b[4].buf, *delays = b[5].buf;
    const int64_t *pair_bin = b[6].buf, *pair_series = b[7].buf, *limits = b[8].buf;
    const int64_t tol = limits[0], bin_ns = limits[1], gap = limits[2], most = limits[3];
    for (Py_ssize_t p = 0; p < n_pairs; p++) {
        if (pair_bin[p] < 0 || pair_bin[p] >= n_bins || pair_series[p] < 0 || pair_series[p] >= width) {
            PyErr_SetString(PyExc_ValueError, "pair_bin, pair_series: a bin and a column of buf");
            goto done;
        }
    }
    double *value = b[9].buf, *lead = b[11].buf;
    char *ok = b[10].buf;
    int64_t last[MAX_BINS], count[MAX_BINS], safe[MAX_BINS];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t s = slots[r], nw = newest[r], bg = begin[r];
        if (s < 0 || s >= n_slots || bg < 0 || nw < bg || nw - bg >= size) {
            PyErr_Format(PyExc_ValueError, "row %zd: slot %lld, observations %lld..%lld: not in the ring", r,
                         (long long)s, (long long)bg, (long long)nw);
            goto done;
        }
        const int64_t *ts = t + s * size;
        const double *rb = buf + s * (size + 1) * width;
        const int64_t t_now = ts[nw % size];
        for (Py_ssize_t k = 0; k < n_bins; k++) {
            const int64_t e = delays[k], upper = tol - e;
            int64_t jl = after(ts, size, t_now, bg, nw + 1, upper) - 1; /* at most nw */
            int64_t lo = after(ts, size, t_now, bg, nw + 1, upper - bin_ns);
            int64_t n = jl - lo + 1;
            int64_t sf = jl > bg ? jl : bg;
            int64_t span = t_now - ts[sf % size];
            last[k] = jl, count[k] = n < most ? n : most, safe[k] = sf;
            ok[r * n_bins + k] = jl >= bg && span > 0 && span <= e + gap;
            lead[r * n_bins + k] = rb[(sf % size) * width + width - 1];
        }
        for (Py_ssize_t p = 0; p < n_pairs; p++) {
            const int64_t k = pair_bin[p], col = pair_series[p], n = count[k];
            double v;
            if (n >= 1) {
                double acc = 0.0; /* newest first from +0.0: a leading -0.0 becomes +0.0 */
                for (int64_t i = 0; i < n; i++) acc += rb[((last[k] - i) % size) * width + col];
                v = acc / (double)n;
            } else {
                v = rb[(safe[k] % size) * width + col]; /* an empty bin: its last observation's value */
            }
            value[r * n_pairs + p] = v;
        }
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef history_methods[] = {
    {"bins", (PyCFunction)(void (*)(void))bins, METH_FASTCALL,
     "bins(buf, t, slots, newest, begin, delays, pair_bin, pair_series, limits, value, ok, lead): the bins of "
     "each row's newest observation (see executor.history.HistoryRing.newest)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef history_module = {
    PyModuleDef_HEAD_INIT, "executor._history", "The history features' bins in C (see executor.history).", -1,
    history_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__history(void) { return PyModule_Create(&history_module); }

/* ood._tick: one session's gate tick (ood.one_row.OneRowTick) and the change and freeze loops in C.
 *
 * Why: with one session ticking, the gate's cost is Python bookkeeping and numpy's per-call work, not
 * arithmetic. Kernel.decide is OneRowTick._decide: per gate the score from the buffer's linear terms
 * and squares, the norm guard, the feature range check on the row's values, changes and context, the
 * threshold, then the filters (their Python rule, called only when it can move, as in Python) and
 * the gate nearest its threshold. Kernel.step first fills that buffer as numpy's calls would, with the
 * BLAS routines numpy itself calls (found by ood/blas.py; OpenBLAS sums in its own order, so any other
 * summation would change the scores' last bits).
 *
 * Every pass is the pure-Python one line by line, with the same float64 operations in the same order
 * (built with -ffp-contract=off: no fused multiply-add), so the bits are the same;
 * tests/ood/test_compiled.py and tests/ood/test_one_row.py compare them. Anything it does not know how
 * to read (a source that is
 * not a float32/float64 row or a list of floats, a length that does not match its limits) returns
 * NotImplemented before any state moves, and the caller takes the Python pass, the reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define SQ_LOW 1e-200 /* ood.score._SQ_LOW, _SQ_HIGH */
#define SQ_HIGH 1e200

typedef struct {
    double cc;            /* ||c W||^2 */
    Py_ssize_t n_classes; /* 0: a single Gaussian */
    double *oo, *co;      /* per class ||o_k||^2, (c W) . o_k */
    int relative;
    double cc_bg;
    double low, high, threshold;
    int ranged;
    Py_ssize_t limit_len[3]; /* values, changes, context; -1: no limit on that source */
    double *limit_low[3], *limit_high[3];
    PyObject *state;   /* the filter's live per-slot states (a list) */
    PyObject *advance; /* advance(state, exceed, immediate) -> (state, alarm) */
    PyObject *quiet;   /* a state a clean tick leaves as it is */
} Gate;

/* numpy's own BLAS routines (ood/blas.py finds them), 64-bit integer interface */
typedef void (*gemv_fn)(int order, int trans, int64_t m, int64_t n, double alpha, const double *a, int64_t lda,
                        const double *x, int64_t incx, double beta, double *y, int64_t incy);
typedef double (*ddot_fn)(int64_t n, const double *x, int64_t incx, const double *y, int64_t incy);
#define CBLAS_ROW_MAJOR 101
#define CBLAS_TRANS 112

typedef struct {
    Py_buffer proj; /* (d, cols) float64, C-contiguous: [x | x W | (x W_bg) | linear terms | squares' zeros] */
    Py_buffer wide; /* (1, d) float64: the row, widened */
    Py_buffer out;  /* (1, cols) float64: the gate's row of the scorer's buffer */
    int held;
} Product;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n_gates, n_linear;
    Gate *gates;
    Py_buffer tail; /* (gates, linear terms + squares) float64, the scorer's own buffer */
    int has_tail;
    /* the products and squares (StackedScorer._score_rows's numpy calls), when numpy's BLAS was found */
    gemv_fn gemv;
    ddot_fn ddot;
    Py_ssize_t width, parts;
    Product *products;
} Kernel;

static int read_doubles(PyObject *seq, Py_ssize_t *len, double **out) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of floats");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    double *v = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (v == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (v[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(v);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    *len = n;
    *out = v;
    return 0;
}

static void kernel_dealloc(Kernel *self) {
    if (self->gates != NULL) {
        for (Py_ssize_t g = 0; g < self->n_gates; g++) {
            Gate *gate = &self->gates[g];
            PyMem_Free(gate->oo);
            PyMem_Free(gate->co);
            for (int i = 0; i < 3; i++) {
                PyMem_Free(gate->limit_low[i]);
                PyMem_Free(gate->limit_high[i]);
            }
            Py_XDECREF(gate->state);
            Py_XDECREF(gate->advance);
            Py_XDECREF(gate->quiet);
        }
        PyMem_Free(self->gates);
    }
    if (self->has_tail) PyBuffer_Release(&self->tail);
    if (self->products != NULL) {
        for (Py_ssize_t g = 0; g < self->n_gates; g++) {
            Product *p = &self->products[g];
            if (p->held) {
                PyBuffer_Release(&p->proj);
                PyBuffer_Release(&p->wide);
                PyBuffer_Release(&p->out);
            }
        }
        PyMem_Free(self->products);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Kernel(n_linear, tail, gates): tail the (gates, L) float64 view of the scorer's buffer; gates a
 * sequence of (cc, oo, co, cc_bg, low, high, threshold, limits, state, advance, quiet) with oo, co
 * lists (None for a single Gaussian), cc_bg a float (relative) or None, limits None or three
 * (low, high) pairs of float lists or None (values, changes, context). */
static int init_products(Kernel *self, PyObject *blas);

static int kernel_init(Kernel *self, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    Py_ssize_t n_linear;
    PyObject *tail, *gates, *blas = Py_None;
    if (!PyArg_ParseTuple(args, "nOO|O", &n_linear, &tail, &gates, &blas)) return -1;
    if (self->gates != NULL || self->has_tail) {
        PyErr_SetString(PyExc_RuntimeError, "a Kernel is initialised once");
        return -1;
    }
    if (PyObject_GetBuffer(tail, &self->tail, PyBUF_RECORDS_RO) < 0) return -1;
    self->has_tail = 1;
    if (self->tail.ndim != 2 || strcmp(self->tail.format, "d") != 0 || self->tail.shape[1] < n_linear + 2) {
        PyErr_SetString(PyExc_ValueError, "tail must be a 2-d float64 buffer of linear terms then squares");
        return -1;
    }
    PyObject *fast = PySequence_Fast(gates, "gates must be a sequence");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != self->tail.shape[0]) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "one tail row per gate");
        return -1;
    }
    self->gates = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Gate));
    if (self->gates == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    self->n_gates = n;
    self->n_linear = n_linear;
    for (Py_ssize_t g = 0; g < n; g++) {
        Gate *gate = &self->gates[g];
        for (int i = 0; i < 3; i++) gate->limit_len[i] = -1;
        PyObject *oo, *co, *cc_bg, *limits;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, g), "dOOOdddOOOO;a gate's constants", &gate->cc, &oo, &co,
                              &cc_bg, &gate->low, &gate->high, &gate->threshold, &limits, &gate->state,
                              &gate->advance, &gate->quiet))
            goto fail;
        Py_INCREF(gate->state);
        Py_INCREF(gate->advance);
        Py_INCREF(gate->quiet);
        if (oo != Py_None) {
            Py_ssize_t n_co;
            if (read_doubles(oo, &gate->n_classes, &gate->oo) < 0 || read_doubles(co, &n_co, &gate->co) < 0)
                goto fail;
            if (n_co != gate->n_classes || gate->n_classes == 0) {
                PyErr_SetString(PyExc_ValueError, "class terms: one ||o_k||^2 and one (c W) . o_k per class");
                goto fail;
            }
        }
        if (cc_bg != Py_None) {
            gate->relative = 1;
            gate->cc_bg = PyFloat_AsDouble(cc_bg);
            if (gate->cc_bg == -1.0 && PyErr_Occurred()) goto fail;
        }
        Py_ssize_t needed = n_linear + 2 + gate->relative;
        if (self->tail.shape[1] < needed || (gate->n_classes && n_linear < 1 + gate->relative + gate->n_classes)) {
            PyErr_SetString(PyExc_ValueError, "the tail is shorter than the gate's terms");
            goto fail;
        }
        if (limits != Py_None) {
            gate->ranged = 1;
            PyObject *lf = PySequence_Fast(limits, "limits must be a sequence");
            if (lf == NULL) goto fail;
            if (PySequence_Fast_GET_SIZE(lf) != 3) {
                Py_DECREF(lf);
                PyErr_SetString(PyExc_ValueError, "limits: (values, changes, context)");
                goto fail;
            }
            for (int i = 0; i < 3; i++) {
                PyObject *pair = PySequence_Fast_GET_ITEM(lf, i), *lo, *hi;
                if (pair == Py_None) continue;
                Py_ssize_t n_lo, n_hi;
                if (!PyArg_ParseTuple(pair, "OO;a (low, high) pair", &lo, &hi) ||
                    read_doubles(lo, &n_lo, &gate->limit_low[i]) < 0 ||
                    read_doubles(hi, &n_hi, &gate->limit_high[i]) < 0) {
                    Py_DECREF(lf);
                    goto fail;
                }
                if (n_lo != n_hi) {
                    Py_DECREF(lf);
                    PyErr_SetString(PyExc_ValueError, "low and high limits of one length");
                    goto fail;
                }
                gate->limit_len[i] = n_lo;
            }
            Py_DECREF(lf);
        }
    }
    Py_DECREF(fast);
    return blas == Py_None ? 0 : init_products(self, blas);
fail:
    Py_DECREF(fast);
    return -1;
}

/* blas: (gemv address, ddot address, width, parts, [(proj, wide, out) per gate]) */
static int init_products(Kernel *self, PyObject *blas) {
    unsigned long long gemv, ddot;
    PyObject *rows;
    if (!PyArg_ParseTuple(blas, "KKnnO;blas: (gemv, ddot, width, parts, rows)", &gemv, &ddot, &self->width,
                          &self->parts, &rows))
        return -1;
    PyObject *fast = PySequence_Fast(rows, "rows must be a sequence");
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != self->n_gates || gemv == 0 || ddot == 0) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "blas: two routines and one (proj, wide, out) per gate");
        return -1;
    }
    self->products = PyMem_Calloc((size_t)(self->n_gates ? self->n_gates : 1), sizeof(Product));
    if (self->products == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t g = 0; g < self->n_gates; g++) {
        Product *p = &self->products[g];
        PyObject *proj, *wide, *out;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, g), "OOO;(proj, wide, out)", &proj, &wide, &out))
            goto fail;
        if (PyObject_GetBuffer(proj, &p->proj, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        if (PyObject_GetBuffer(wide, &p->wide, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&p->proj);
            goto fail;
        }
        if (PyObject_GetBuffer(out, &p->out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&p->proj);
            PyBuffer_Release(&p->wide);
            goto fail;
        }
        p->held = 1;
        Py_ssize_t cols = p->out.ndim == 2 ? p->out.shape[1] : -1;
        if (p->proj.ndim != 2 || p->wide.ndim != 2 || p->out.ndim != 2 || strcmp(p->proj.format, "d") != 0 ||
            strcmp(p->wide.format, "d") != 0 || strcmp(p->out.format, "d") != 0 || p->wide.shape[0] != 1 ||
            p->out.shape[0] != 1 || p->proj.shape[0] != p->wide.shape[1] || p->proj.shape[1] != cols ||
            cols < (1 + self->parts) * self->width + 1 + self->parts) {
            PyErr_SetString(PyExc_ValueError, "blas: proj (d, cols), wide (1, d), out (1, cols), float64, C-contiguous");
            goto fail;
        }
    }
    Py_DECREF(fast);
    self->gemv = (gemv_fn)(uintptr_t)gemv;
    self->ddot = (ddot_fn)(uintptr_t)ddot;
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* The gates' buffer rows as ``OneRowTick.step``'s numpy calls fill them, by the same BLAS routines
 * with the same arguments: each row widened to float64 (what ndarray.dot does to a float32 row), then
 * cblas_dgemv(RowMajor, Trans, d, cols, 1, proj, cols, row, 1, 0, out, 1) (ndarray.dot of a (1, d)
 * row with a C-contiguous matrix), then each block's sum of squares as numpy's DOUBLE_dot makes it
 * (0.0 + cblas_ddot). 1 when done; 0 when a gate's features are None (the general path's); -2 when a
 * row is not a (1, d) float32 row or contiguous float64 row (numpy's calls take it). */
static int fill_products(Kernel *self, PyObject *features) {
    Py_ssize_t parts = self->parts, width = self->width;
    for (Py_ssize_t g = 0; g < self->n_gates; g++) {
        Product *p = &self->products[g];
        PyObject *src = PySequence_GetItem(features, g);
        if (src == NULL) return -1;
        if (src == Py_None) {
            Py_DECREF(src);
            return 0;
        }
        Py_buffer view;
        int got = PyObject_GetBuffer(src, &view, PyBUF_RECORDS_RO);
        Py_DECREF(src);
        if (got < 0) {
            PyErr_Clear();
            return -2;
        }
        Py_ssize_t d = p->proj.shape[0], cols = p->proj.shape[1];
        int f32 = view.format != NULL && strcmp(view.format, "f") == 0;
        int f64 = view.format != NULL && strcmp(view.format, "d") == 0 && view.strides[1] == (Py_ssize_t)sizeof(double);
        if (view.ndim != 2 || view.shape[0] != 1 || view.shape[1] != d || !(f32 || f64)) {
            PyBuffer_Release(&view);
            return -2;
        }
        double *wide = (double *)p->wide.buf, *out = (double *)p->out.buf;
        const char *q = (const char *)view.buf;
        for (Py_ssize_t i = 0; i < d; i++, q += view.strides[1])
            wide[i] = f32 ? (double)*(const float *)q : *(const double *)q;
        PyBuffer_Release(&view);
        self->gemv(CBLAS_ROW_MAJOR, CBLAS_TRANS, d, cols, 1.0, (const double *)p->proj.buf, cols, wide, 1, 0.0, out, 1);
        for (Py_ssize_t j = 0; j <= parts; j++) {
            double sum = 0.0;
            sum += self->ddot(width, out + j * width, 1, out + j * width, 1);
            out[cols - 1 - parts + j] = sum;
        }
    }
    return 1;
}

/* One source's first row outside [low, high] anywhere (NaN compares False, as in Python and numpy):
 * 1 or 0; -2 when the source is not a list of floats or a float32/float64 row of the limits' length
 * (the caller takes the Python pass); -1 with an exception set. */
static int row_outside(PyObject *src, Py_ssize_t len, const double *low, const double *high) {
    if (PyList_Check(src)) { /* ChangeTracker's rows: a list of lists of floats */
        if (PyList_GET_SIZE(src) < 1) return -2;
        PyObject *row = PyList_GET_ITEM(src, 0);
        if (!PyList_Check(row) || PyList_GET_SIZE(row) != len) return -2;
        for (Py_ssize_t i = 0; i < len; i++) {
            PyObject *item = PyList_GET_ITEM(row, i);
            if (!PyFloat_CheckExact(item)) return -2;
            double v = PyFloat_AS_DOUBLE(item);
            if (v < low[i] || v > high[i]) return 1;
        }
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(src, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return -2;
    }
    int out = -2;
    if (view.ndim == 2 && view.shape[0] >= 1 && view.shape[1] == len && view.format != NULL) {
        const char *p = (const char *)view.buf;
        Py_ssize_t step = view.strides[1];
        if (strcmp(view.format, "f") == 0) {
            out = 0;
            for (Py_ssize_t i = 0; i < len; i++, p += step) {
                double v = (double)*(const float *)p;
                if (v < low[i] || v > high[i]) {
                    out = 1;
                    break;
                }
            }
        } else if (strcmp(view.format, "d") == 0) {
            out = 0;
            for (Py_ssize_t i = 0; i < len; i++, p += step) {
                double v = *(const double *)p;
                if (v < low[i] || v > high[i]) {
                    out = 1;
                    break;
                }
            }
        }
    }
    PyBuffer_Release(&view);
    return out;
}

/* item g of a sequence of per-gate sources, or None for a missing sequence: a new reference */
static PyObject *source_of(PyObject *seq, Py_ssize_t g) {
    if (seq == Py_None) return Py_NewRef(Py_None);
    return PySequence_GetItem(seq, g);
}

/* OneRowTick._outside: 1, 0, -2 (take the Python pass) or -1 (error) */
static int gate_outside(const Gate *gate, Py_ssize_t g, PyObject *features, PyObject *changes, PyObject *context) {
    PyObject *seqs[3] = {features, changes, context};
    for (int i = 0; i < 3; i++) {
        if (gate->limit_len[i] < 0) continue;
        PyObject *src = source_of(seqs[i], g);
        if (src == NULL) return -1;
        int r = src == Py_None ? 0 : row_outside(src, gate->limit_len[i], gate->limit_low[i], gate->limit_high[i]);
        Py_DECREF(src);
        if (r != 0) return r;
    }
    return 0;
}

/* ood.one_row.ratio_at_zero: score / 0.0 with IEEE (numpy) semantics */
static double ratio_at_zero(double score, double threshold) {
    if (score == 0.0 || score != score) return NAN;
    return copysign(INFINITY, score) * copysign(1.0, threshold);
}

#define MAX_STACK_GATES 16

/* decide(slot, features, also, changes, context) -> ([score], [threshold], [alarm]) | None | NotImplemented */
static PyObject *kernel_decide(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "decide(slot, features, also, changes, context)");
        return NULL;
    }
    PyObject *slot = args[0], *features = args[1], *also = args[2], *changes = args[3], *context = args[4];
    Py_ssize_t n_gates = self->n_gates, nl = self->n_linear;
    double d2s[MAX_STACK_GATES];
    char exceeds[MAX_STACK_GATES], immediates[MAX_STACK_GATES];
    if (n_gates > MAX_STACK_GATES) Py_RETURN_NOTIMPLEMENTED;
    const char *row = (const char *)self->tail.buf;
    Py_ssize_t row_step = self->tail.strides[0], col = self->tail.strides[1];
#define LIN(k) (*(const double *)(row + (k) * col))
    for (Py_ssize_t g = 0; g < n_gates; g++, row += row_step) {
        const Gate *gate = &self->gates[g];
        double s = LIN(nl); /* ||x||^2 */
        if (!(SQ_LOW <= s && s <= SQ_HIGH) && s != 0.0) Py_RETURN_NONE; /* NaN/Inf, or squares far from 1 */
        double n = sqrt(s);
        double d = n != 0.0 ? n : DBL_MIN; /* an all-zero row: the centre's distance from the origin */
        double d2 = (LIN(nl + 1) / d - 2.0 * LIN(0)) / d + gate->cc;
        if (gate->n_classes) { /* ood.score.class_conditional */
            Py_ssize_t at = gate->relative ? 2 : 1;
            double best = 0.0;
            for (Py_ssize_t k = 0; k < gate->n_classes; k++) {
                double v = gate->oo[k] - 2.0 * (LIN(at + k) / d - gate->co[k]);
                if (k == 0 || v < best) best = v; /* Python's min: the first of equals, NaN kept first */
            }
            d2 = d2 + best;
            if (0.0 > d2) d2 = 0.0; /* Python's max(d2, 0.0) */
            if (gate->relative) d2 -= (LIN(nl + 2) / d - 2.0 * LIN(1)) / d + gate->cc_bg;
        }
        int immediate = n < gate->low || n > gate->high; /* the raw norm's guard */
        if (gate->ranged && !immediate) {
            int r = gate_outside(gate, g, features, changes, context);
            if (r == -1) return NULL;
            if (r == -2) Py_RETURN_NOTIMPLEMENTED;
            immediate = r;
        }
        d2s[g] = d2;
        exceeds[g] = d2 > gate->threshold;
        immediates[g] = (char)immediate;
    }
#undef LIN
    /* every gate scored: only now move the filters */
    int alarm = 0;
    if (also != Py_None) {
        PyObject *first = PySequence_GetItem(also, 0);
        if (first == NULL) return NULL;
        alarm = PyObject_IsTrue(first);
        Py_DECREF(first);
        if (alarm < 0) return NULL;
    }
    double top = -INFINITY, score = 0.0, threshold = 0.0;
    for (Py_ssize_t g = 0; g < n_gates; g++) {
        const Gate *gate = &self->gates[g];
        double d2 = d2s[g];
        PyObject *state = PyObject_GetItem(gate->state, slot);
        if (state == NULL) return NULL;
        int move = exceeds[g] || immediates[g];
        if (!move) { /* Python's `state != quiet` (not RichCompareBool, which calls an object equal to itself) */
            PyObject *ne = PyObject_RichCompare(state, gate->quiet, Py_NE);
            move = ne == NULL ? -1 : PyObject_IsTrue(ne);
            Py_XDECREF(ne);
            if (move < 0) {
                Py_DECREF(state);
                return NULL;
            }
        }
        if (move) { /* else the filter stays as it is */
            PyObject *call[3] = {state, exceeds[g] ? Py_True : Py_False, immediates[g] ? Py_True : Py_False};
            PyObject *res = PyObject_Vectorcall(gate->advance, call, 3, NULL);
            Py_DECREF(state);
            if (res == NULL) return NULL;
            PyObject *new_state, *a;
            if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
                Py_DECREF(res);
                PyErr_SetString(PyExc_TypeError, "a filter's advance returns (state, alarm)");
                return NULL;
            }
            new_state = PyTuple_GET_ITEM(res, 0);
            a = PyTuple_GET_ITEM(res, 1);
            if (PyObject_SetItem(gate->state, slot, new_state) < 0) {
                Py_DECREF(res);
                return NULL;
            }
            int truth = PyObject_IsTrue(a);
            Py_DECREF(res);
            if (truth < 0) return NULL;
            if (truth) alarm = 1;
        } else {
            Py_DECREF(state);
        }
        double t = gate->threshold;
        double ratio = t != 0.0 ? d2 / t : ratio_at_zero(d2, t);
        if (ratio > top) {
            top = ratio;
            score = d2;
            threshold = t;
        }
    }
    return Py_BuildValue("([d][d][O])", score, threshold, alarm ? Py_True : Py_False); /* GateBank.step_lists's */
}

/* -- the per-slot trackers' rows (ood.change.ChangeTracker.step, ood.freeze.FreezeDetector.step) ----------
 * Both keep each slot's last fresh observation as a list of Python floats; per row this is the same
 * list building and float64 arithmetic as their Python loops, without the interpreter around it. */

/* x as a 2-d row-major float32 buffer, or 0 (the caller takes the Python loop) */
static int float32_rows(PyObject *x, Py_buffer *view) {
    if (PyObject_GetBuffer(x, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (view->ndim == 2 && view->format != NULL && strcmp(view->format, "f") == 0) return 1;
    PyBuffer_Release(view);
    return 0;
}

static PyObject *row_list(const Py_buffer *view, Py_ssize_t r) {
    Py_ssize_t dim = view->shape[1];
    const char *p = (const char *)view->buf + r * view->strides[0];
    PyObject *row = PyList_New(dim);
    if (row == NULL) return NULL;
    for (Py_ssize_t i = 0; i < dim; i++, p += view->strides[1]) {
        PyObject *v = PyFloat_FromDouble((double)*(const float *)p);
        if (v == NULL) {
            Py_DECREF(row);
            return NULL;
        }
        PyList_SET_ITEM(row, i, v);
    }
    return row;
}

/* a tracker's stored row: a list of `dim` floats, or an error (it only ever stores such lists) */
static int stored_row(PyObject *row, Py_ssize_t dim) {
    if (!PyList_Check(row) || PyList_GET_SIZE(row) != dim) goto bad;
    for (Py_ssize_t i = 0; i < dim; i++)
        if (!PyFloat_CheckExact(PyList_GET_ITEM(row, i))) goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "a stored observation is not a list of floats of the features' length");
    return -1;
}

/* change_step(python, last, last_t, change, unknown, x, slots, fresh, finite, times): ChangeTracker.step's
 * loop over its per-slot lists; python(x, slots, fresh, finite, times), the Python loop, when x is not a
 * 2-d float32 buffer (bound by functools.partial, this is the tracker's step: no Python frame around the
 * C one). The rate is (now - before) / dt with dt = (double)(t - t_before) * 1e-9, as in Python. */
static PyObject *change_step(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "change_step(python, last, last_t, change, unknown, x, slots, fresh, finite, times)");
        return NULL;
    }
    PyObject *last = args[1], *last_t = args[2], *change = args[3], *unknown = args[4];
    args += 1; /* from here on as the loop's arguments: last, last_t, change, unknown, x, slots, fresh, finite,
                  times */
    Py_buffer view;
    if (!float32_rows(args[4], &view)) return PyObject_Vectorcall(args[-1], args + 4, 5, NULL);
    PyObject *slots = NULL, *fresh = NULL, *finite = NULL, *times = NULL, *out = NULL;
    if ((slots = PySequence_Fast(args[5], "slots")) == NULL || (fresh = PySequence_Fast(args[6], "fresh")) == NULL ||
        (finite = PySequence_Fast(args[7], "finite")) == NULL || (times = PySequence_Fast(args[8], "times")) == NULL)
        goto done;
    Py_ssize_t n = view.shape[0], dim = view.shape[1]; /* zip: the shortest */
    if (PySequence_Fast_GET_SIZE(slots) < n) n = PySequence_Fast_GET_SIZE(slots);
    if (PySequence_Fast_GET_SIZE(fresh) < n) n = PySequence_Fast_GET_SIZE(fresh);
    if (PySequence_Fast_GET_SIZE(finite) < n) n = PySequence_Fast_GET_SIZE(finite);
    if (PySequence_Fast_GET_SIZE(times) < n) n = PySequence_Fast_GET_SIZE(times);
    if ((out = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *slot = PySequence_Fast_GET_ITEM(slots, r);
        int is_fresh = PyObject_IsTrue(PySequence_Fast_GET_ITEM(fresh, r));
        if (is_fresh < 0) goto fail;
        if (is_fresh) {
            int ok = PyObject_IsTrue(PySequence_Fast_GET_ITEM(finite, r));
            if (ok < 0) goto fail;
            if (!ok) {
                if (PyObject_SetItem(change, slot, unknown) < 0) goto fail;
            } else {
                PyObject *t_obj = PySequence_Fast_GET_ITEM(times, r);
                long long t = PyLong_AsLongLong(t_obj);
                if (t == -1 && PyErr_Occurred()) goto fail;
                PyObject *before = PyObject_GetItem(last, slot), *before_t = NULL, *now = NULL, *diff = NULL;
                if (before == NULL) goto fail;
                int err = (before_t = PyObject_GetItem(last_t, slot)) == NULL;
                long long t0 = err ? 0 : PyLong_AsLongLong(before_t);
                err = err || (t0 == -1 && PyErr_Occurred()) || (now = row_list(&view, r)) == NULL;
                double dt = (double)(t - t0) * 1e-9; /* ood.change.NS */
                if (!err && (before == Py_None || !(dt > 0.0))) {
                    err = PyObject_SetItem(change, slot, unknown) < 0;
                } else if (!err) {
                    err = stored_row(before, dim) < 0 || (diff = PyList_New(dim)) == NULL;
                    for (Py_ssize_t i = 0; !err && i < dim; i++) {
                        PyObject *v = PyFloat_FromDouble((PyFloat_AS_DOUBLE(PyList_GET_ITEM(now, i)) -
                                                          PyFloat_AS_DOUBLE(PyList_GET_ITEM(before, i))) /
                                                         dt);
                        if (v == NULL) err = 1;
                        else PyList_SET_ITEM(diff, i, v);
                    }
                    err = err || PyObject_SetItem(change, slot, diff) < 0;
                }
                err = err || PyObject_SetItem(last, slot, now) < 0 || PyObject_SetItem(last_t, slot, t_obj) < 0;
                Py_DECREF(before);
                Py_XDECREF(before_t);
                Py_XDECREF(now);
                Py_XDECREF(diff);
                if (err) goto fail;
            }
        }
        PyObject *c = PyObject_GetItem(change, slot);
        if (c == NULL) goto fail;
        int err = PyList_Append(out, c);
        Py_DECREF(c);
        if (err < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(slots);
    Py_XDECREF(fresh);
    Py_XDECREF(finite);
    Py_XDECREF(times);
    PyBuffer_Release(&view);
    return out;
}

/* freeze_step(python, last, count, keep, rest_at, rest_speed, from_moving, moving_speed, repeats, x, slots, fresh):
 * FreezeDetector.step's loop for float32 rows; python(x, slots, fresh), the Python loop, for any other x. A row
 * equals the stored one when every component the slot compares (keep[slot]: None for all, else a list of
 * positions) compares == (NaN never does), as Python's list == compares these fresh floats. With a speed
 * (rest_at[slot] >= 0): a new reading sets from_moving[slot] to whether the stored one read |v| > moving_speed;
 * a repeat reading |v| <= rest_speed whose run did not begin from moving is a car at rest and resets the count,
 * as in Python. */
static PyObject *freeze_step(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "freeze_step(python, last, count, keep, rest_at, rest_speed, from_moving, "
                                         "moving_speed, repeats, x, slots, fresh)");
        return NULL;
    }
    PyObject *python = args[0], *last = args[1], *count = args[2], *keep = args[3], *rest_at = args[4];
    PyObject *from_moving = args[6], *repeats = args[8];
    double rest_speed = PyFloat_AsDouble(args[5]);
    if (rest_speed == -1.0 && PyErr_Occurred()) return NULL;
    double moving_speed = PyFloat_AsDouble(args[7]);
    if (moving_speed == -1.0 && PyErr_Occurred()) return NULL;
    args += 3;
    Py_buffer view;
    if (!float32_rows(args[6], &view)) return PyObject_Vectorcall(python, args + 6, 3, NULL);
    PyObject *slots = NULL, *fresh = NULL, *out = NULL;
    if ((slots = PySequence_Fast(args[7], "slots")) == NULL || (fresh = PySequence_Fast(args[8], "fresh")) == NULL)
        goto done;
    Py_ssize_t n = view.shape[0], dim = view.shape[1];
    if (PySequence_Fast_GET_SIZE(slots) < n) n = PySequence_Fast_GET_SIZE(slots);
    if (PySequence_Fast_GET_SIZE(fresh) < n) n = PySequence_Fast_GET_SIZE(fresh);
    if ((out = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *slot = PySequence_Fast_GET_ITEM(slots, r);
        int is_fresh = PyObject_IsTrue(PySequence_Fast_GET_ITEM(fresh, r));
        if (is_fresh < 0) goto fail;
        if (is_fresh) { /* a reused observation is not a repeat of the sensor */
            PyObject *before = PyObject_GetItem(last, slot), *now = NULL, *c = NULL, *cols = NULL, *at = NULL;
            if (before == NULL) goto fail;
            int err = stored_row(before, dim) < 0 || (now = row_list(&view, r)) == NULL ||
                      (cols = PyObject_GetItem(keep, slot)) == NULL || (at = PyObject_GetItem(rest_at, slot)) == NULL;
            int same = 1;
            if (!err && cols == Py_None) {
                for (Py_ssize_t i = 0; same && i < dim; i++)
                    same = PyFloat_AS_DOUBLE(PyList_GET_ITEM(now, i)) == PyFloat_AS_DOUBLE(PyList_GET_ITEM(before, i));
            } else if (!err) {
                if (!PyList_Check(cols)) {
                    PyErr_SetString(PyExc_ValueError, "a slot's compared features are None or a list of positions");
                    err = 1;
                }
                for (Py_ssize_t k = 0; !err && same && k < PyList_GET_SIZE(cols); k++) {
                    Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(cols, k));
                    if (i == -1 && PyErr_Occurred()) err = 1;
                    else if (i < 0 || i >= dim) {
                        PyErr_SetString(PyExc_ValueError, "a compared feature's position is outside the row");
                        err = 1;
                    } else
                        same = PyFloat_AS_DOUBLE(PyList_GET_ITEM(now, i)) ==
                               PyFloat_AS_DOUBLE(PyList_GET_ITEM(before, i));
                }
            }
            Py_ssize_t speed_at = -1;
            if (!err) {
                speed_at = PyLong_AsSsize_t(at);
                if (speed_at == -1 && PyErr_Occurred()) err = 1;
                else if (speed_at >= dim) {
                    PyErr_SetString(PyExc_ValueError, "the speed feature's position is outside the row");
                    err = 1;
                }
            }
            if (!err && !same && speed_at >= 0) { /* a new reading: did it come straight from moving? */
                int moving = fabs(PyFloat_AS_DOUBLE(PyList_GET_ITEM(before, speed_at))) > moving_speed;
                err = PyObject_SetItem(from_moving, slot, moving ? Py_True : Py_False) < 0;
            } else if (!err && same && speed_at >= 0 &&
                       fabs(PyFloat_AS_DOUBLE(PyList_GET_ITEM(now, speed_at))) <= rest_speed) {
                PyObject *flag = PyObject_GetItem(from_moving, slot);
                int moved = flag == NULL ? -1 : PyObject_IsTrue(flag);
                Py_XDECREF(flag);
                if (moved < 0) err = 1;
                else if (!moved) same = 0; /* a car at rest */
            }
            if (!err && same) {
                PyObject *old = PyObject_GetItem(count, slot);
                Py_ssize_t k = old == NULL ? -1 : PyLong_AsSsize_t(old);
                Py_XDECREF(old);
                err = (k == -1 && PyErr_Occurred()) || old == NULL || (c = PyLong_FromSsize_t(k + 1)) == NULL;
            } else if (!err) {
                c = PyLong_FromLong(0);
                err = c == NULL;
            }
            err = err || PyObject_SetItem(count, slot, c) < 0 || PyObject_SetItem(last, slot, now) < 0;
            Py_DECREF(before);
            Py_XDECREF(now);
            Py_XDECREF(c);
            Py_XDECREF(cols);
            Py_XDECREF(at);
            if (err) goto fail;
        }
        PyObject *c = PyObject_GetItem(count, slot);
        if (c == NULL) goto fail;
        int alarm = PyObject_RichCompareBool(c, repeats, Py_GE);
        Py_DECREF(c);
        if (alarm < 0 || PyList_Append(out, alarm ? Py_True : Py_False) < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(slots);
    Py_XDECREF(fresh);
    PyBuffer_Release(&view);
    return out;
}

/* widen(src, dst): copy a float32 row buffer into a float64 one of the same shape (exact) and return
 * True; False (nothing written) for any other pair. numpy's dot of a float32 row with a float64
 * matrix makes this very copy itself, in a fresh array, at more cost per call. */
static PyObject *widen(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "widen(src, dst)");
        return NULL;
    }
    Py_buffer src, dst;
    if (!float32_rows(args[0], &src)) Py_RETURN_FALSE;
    if (PyObject_GetBuffer(args[1], &dst, PyBUF_RECORDS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    int ok = dst.ndim == 2 && dst.format != NULL && strcmp(dst.format, "d") == 0 && dst.shape[0] == src.shape[0] &&
             dst.shape[1] == src.shape[1];
    for (Py_ssize_t r = 0; ok && r < src.shape[0]; r++) {
        const char *p = (const char *)src.buf + r * src.strides[0];
        char *q = (char *)dst.buf + r * dst.strides[0];
        for (Py_ssize_t i = 0; i < src.shape[1]; i++, p += src.strides[1], q += dst.strides[1])
            *(double *)q = (double)*(const float *)p;
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyBool_FromLong(ok);
}

static PyMethodDef module_methods[] = {
    {"widen", (PyCFunction)(void (*)(void))widen, METH_FASTCALL,
     "widen(src, dst) -> True after copying a float32 row buffer into a float64 one of its shape, else False"},
    {"change_step", (PyCFunction)(void (*)(void))change_step, METH_FASTCALL,
     "change_step(python, last, last_t, change, unknown, x, slots, fresh, finite, times) -> list of rate rows"},
    {"freeze_step", (PyCFunction)(void (*)(void))freeze_step, METH_FASTCALL,
     "freeze_step(python, last, count, keep, rest_at, rest_speed, from_moving, moving_speed, repeats, x, slots, "
     "fresh) -> list of alarms"},
    {NULL, NULL, 0, NULL},
};

/* products(features) -> True | None (a gate's features are None) | NotImplemented (numpy's calls) */
static PyObject *kernel_products(Kernel *self, PyObject *features) {
    if (self->products == NULL) Py_RETURN_NOTIMPLEMENTED;
    int r = fill_products(self, features);
    if (r == -1) return NULL;
    if (r == -2) Py_RETURN_NOTIMPLEMENTED;
    if (r == 0) Py_RETURN_NONE;
    Py_RETURN_TRUE;
}

/* step(slot, features, also, changes, context): products, then decide, in one call */
static PyObject *kernel_step(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step(slot, features, also, changes, context)");
        return NULL;
    }
    if (self->products == NULL) Py_RETURN_NOTIMPLEMENTED;
    int r = fill_products(self, args[1]);
    if (r == -1) return NULL;
    if (r == -2) Py_RETURN_NOTIMPLEMENTED;
    if (r == 0) Py_RETURN_NONE;
    return kernel_decide(self, args, nargs);
}

static PyObject *kernel_blas(Kernel *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->products != NULL);
}

static PyGetSetDef kernel_getset[] = {
    {"blas", (getter)kernel_blas, NULL, "the products are made here with numpy's BLAS routines", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef kernel_methods[] = {
    {"step", (PyCFunction)(void (*)(void))kernel_step, METH_FASTCALL,
     "step(slot, features, also, changes, context): products() then decide() in one call"},
    {"products", (PyCFunction)kernel_products, METH_O,
     "products(features) -> True after filling the gates' buffer rows, None (a gate's features are None), "
     "NotImplemented (numpy's calls must)"},
    {"decide", (PyCFunction)(void (*)(void))kernel_decide, METH_FASTCALL,
     "decide(slot, features, also, changes, context) -> ([score], [threshold], [alarm]), None for the general path, "
     "NotImplemented for the Python pass"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ood._tick.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A gate bank's one-row decisions after numpy's products (see ood.one_row).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)kernel_init,
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_methods = kernel_methods,
    .tp_getset = kernel_getset,
};

static struct PyModuleDef tick_module = {
    PyModuleDef_HEAD_INIT, "ood._tick", "Compiled per-tick passes of the gate (see ood.compiled).", -1, module_methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC PyInit__tick(void) {
    if (PyType_Ready(&KernelType) < 0) return NULL;
    PyObject *m = PyModule_Create(&tick_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

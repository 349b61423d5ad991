/* planner._rollout: the behaviour planner's rollout of every candidate, and what it comes to, in C.
 *
 * Why: the numpy path (planner.behaviour.BehaviourPlanner._outcome) loops over the 60 steps of the
 * horizon in Python and then makes some thirty (steps x candidates) arrays to score them; for a batch
 * of 32 sessions that is most of the planner's CPU, which competes with the executor's 5 ms ticks.
 * outcome() does the same in one call: steps outside, candidates (columns) inside, as numpy does, and
 * every reduction over the steps (mean, min, max, any) is kept per column as the steps go, so no
 * history is stored.
 *
 * Every value is the numpy path's, line by line, with the same float64 operations in the same order
 * (built with -ffp-contract=off: no fused multiply-add): numpy's axis-0 sums of a C-contiguous (steps,
 * N) array add the rows in order from 0.0, its mean divides that by the row count, np.maximum and
 * np.minimum return the second operand on a tie (np_max, np_min), x**2 is x * x, and
 * the free-road term's ratio**4 is written (r*r)*(r*r) in both paths. Work whose result numpy throws
 * away is skipped: the time-to-collision where the gap is not closing (numpy's np.where gives inf, whose
 * risk is 0), the new follower's check outside a lane change (masked off by `changing`) or once it has
 * failed (an any()), the cut-in risk where no car is near (masked off). tests/planner/test_compiled.py
 * compares the bits.
 *
 * CPython C API only: arrays come in through the buffer protocol (C-contiguous float64, bool masks),
 * and the caller allocates the output.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* The planner's constants, in the order BehaviourPlanner._constants lists them. */
enum Constant {
    STEP_S,
    A_MAX,
    B_COMF,
    B_MAX,
    MIN_GAP,
    TIME_GAP,
    LEAVING_TIME_GAP,
    MERGE_TIME_GAP,
    LANE_CHANGE_S,
    HALF_CHANGE_S, /* 0.5 * lane_change_s: both leaders count before it */
    SQRT_AB,       /* 2 sqrt(a_max b_comf) */
    TTC_MIN_S,
    REAR_MIN_GAP,
    REAR_MIN_TTC_S,
    CUT_IN_MIN_GAP,
    FAR, /* where an absent vehicle is put */
    N_CONSTANTS
};

/* The output rows, in the field order of planner.behaviour._Outcome. */
enum Row { END_SPEED, END_GAP, END_LEAD_V, LEAST_GAP, HEADWAY, TTC_RISK, REAR_BAD, SHORTFALL, ACCEL_SQ, JERK_SQ,
           HARD_BRAKE, CUT_IN, N_ROWS };

/* np.maximum / np.minimum on numbers: a tie (0.0 and -0.0) gives the second operand, as numpy's do
 * (and as x86's maxsd / minsd, which the compiler makes of these). numpy also propagates a NaN in
 * either operand; none can arise here: the inputs are finite (BehaviourPlanner._problems), features are
 * float32 so nothing overflows, and every divisor is floored at a positive constant. */
static inline double np_max(double a, double b) { return a > b ? a : b; }
static inline double np_min(double a, double b) { return a < b ? a : b; }

/* BehaviourPlanner._idm, one column */
static inline double idm(const double *c, double v, double free_road, double gap, double v_lead, double time_gap) {
    double s_star = c[MIN_GAP] + np_max(0.0, v * time_gap + v * (v - v_lead) / c[SQRT_AB]);
    double inter = s_star / np_max(gap, 0.1);
    return free_road - c[A_MAX] * inter * inter;
}

#define N_INPUTS 17

typedef struct {
    Py_buffer views[N_INPUTS + 2]; /* the inputs and out */
    int held;
} Views;

static void release(Views *v) {
    for (int k = 0; k < v->held; k++) PyBuffer_Release(&v->views[k]);
    v->held = 0;
}

/* obj as a C-contiguous 1-d buffer of n items ('d' float64, or '?' bool when flag), n < 0: any n */
static int take(Views *v, PyObject *obj, const char *name, int flag, Py_ssize_t n, int writable) {
    Py_buffer *b = &v->views[v->held];
    int want = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, want) < 0) return -1;
    v->held++;
    const char *fmt = b->format ? b->format : "B";
    int ok = flag ? (b->itemsize == 1 && strcmp(fmt, "?") == 0)
                  : (b->itemsize == 8 && (strcmp(fmt, "d") == 0 || strcmp(fmt, "=d") == 0 || strcmp(fmt, "<d") == 0));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous %s array", name, flag ? "bool" : "float64");
        return -1;
    }
    if (n >= 0 && b->len != n * b->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items, got %zd", name, n, b->len / b->itemsize);
        return -1;
    }
    return 0;
}

static const char *const INPUT_NAMES[N_INPUTS] = {
    "constants", "t", "v0", "target", "changing", "cruise", "own_gap", "own_v", "new_gap", "new_v",
    "rear_gap", "rear_v", "left_near", "left_gap", "left_v", "right_near", "right_gap"};

/* outcome(constants, t, v0, target, changing, cruise, own_gap, own_v, new_gap, new_v, rear_gap, rear_v,
 *         left_near, left_gap, left_v, right_near, right_gap, right_v, out) -> None
 * t: (steps,) the time at the end of each step; the rest (N,) per column; out: (N_ROWS, N) float64,
 * written. */
static PyObject *outcome(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_INPUTS + 2) {
        PyErr_Format(PyExc_TypeError, "outcome() takes %d arguments (%zd given)", N_INPUTS + 2, nargs);
        return NULL;
    }
    Views v = {.held = 0};
    if (take(&v, args[0], "constants", 0, N_CONSTANTS, 0) < 0) goto fail;
    if (take(&v, args[1], "t", 0, -1, 0) < 0) goto fail;
    if (take(&v, args[2], "v0", 0, -1, 0) < 0) goto fail;
    const Py_ssize_t n_steps = v.views[1].len / 8, n = v.views[2].len / 8;
    for (int k = 3; k < N_INPUTS + 1; k++) {
        int flag = k == 4 || k == 12 || k == 15;
        if (take(&v, args[k], k < N_INPUTS ? INPUT_NAMES[k] : "right_v", flag, n, 0) < 0) goto fail;
    }
    if (take(&v, args[N_INPUTS + 1], "out", 0, N_ROWS * n, 1) < 0) goto fail;
    if (n_steps < 2) {
        PyErr_SetString(PyExc_ValueError, "t: the horizon needs at least 2 steps");
        goto fail;
    }
    const double *c = v.views[0].buf, *t = v.views[1].buf, *v0 = v.views[2].buf, *target = v.views[3].buf;
    const char *changing = v.views[4].buf;
    const double *cruise = v.views[5].buf, *own_gap = v.views[6].buf, *own_v = v.views[7].buf;
    const double *new_gap = v.views[8].buf, *new_v = v.views[9].buf, *rear_gap = v.views[10].buf;
    const double *rear_v = v.views[11].buf;
    const char *near[2] = {v.views[12].buf, v.views[15].buf};
    const double *side_gap[2] = {v.views[13].buf, v.views[16].buf}, *side_v[2] = {v.views[14].buf, v.views[17].buf};
    double *out = v.views[18].buf;

    /* per column: position, speed, last acceleration, target speed floored at 0.1, each side's risk */
    double *state = PyMem_Malloc(sizeof(double) * (size_t)(6 * (n ? n : 1)));
    if (state == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    double *S = state, *V = state + n, *A = state + 2 * n, *V0T = state + 3 * n, *SIDE[2] = {state + 4 * n, state + 5 * n};
    double *end_speed = out + END_SPEED * n, *end_gap = out + END_GAP * n, *end_lead_v = out + END_LEAD_V * n;
    double *least_gap = out + LEAST_GAP * n, *headway = out + HEADWAY * n, *ttc_risk = out + TTC_RISK * n;
    double *rear_bad = out + REAR_BAD * n, *shortfall = out + SHORTFALL * n, *accel_sq = out + ACCEL_SQ * n;
    double *jerk_sq = out + JERK_SQ * n, *hard_brake = out + HARD_BRAKE * n, *cut_in = out + CUT_IN * n;

    Py_BEGIN_ALLOW_THREADS
    const double dt = c[STEP_S];
    for (Py_ssize_t j = 0; j < n; j++) {
        S[j] = 0.0;
        V[j] = v0[j];
        V0T[j] = np_max(target[j], 0.1);
        /* numpy's sums start from 0.0 */
        headway[j] = shortfall[j] = accel_sq[j] = jerk_sq[j] = hard_brake[j] = 0.0;
        rear_bad[j] = 0.0;
    }
    for (Py_ssize_t i = 0; i < n_steps; i++) {
        const double ti = t[i];
        const int merging = ti < c[LANE_CHANGE_S], both_count = ti < c[HALF_CHANGE_S], during = ti <= c[LANE_CHANGE_S];
        for (Py_ssize_t j = 0; j < n; j++) {
            const int ch = changing[j] != 0, both = ch && both_count;
            double v = V[j], s = S[j];
            /* ---- BehaviourPlanner._rollout, step i ---- */
            double ratio = v / V0T[j];
            double r2 = ratio * ratio;
            double free_road = np_max(c[A_MAX] * (1.0 - r2 * r2), -c[B_COMF]);
            double new_time_gap = (merging && ch) ? c[MERGE_TIME_GAP] : c[TIME_GAP];
            double new_lead = new_gap[j] + new_v[j] * ti;
            double own_lead = own_gap[j] + own_v[j] * ti;
            double a = idm(c, v, free_road, new_lead - s, new_v[j], new_time_gap);
            if (both) a = np_min(a, idm(c, v, free_road, own_lead - s, own_v[j], c[LEAVING_TIME_GAP]));
            a = np_min(np_max(a, -c[B_MAX]), c[A_MAX]);
            double v_next = np_max(v + a * dt, 0.0);
            a = (v_next - v) / dt;
            s += 0.5 * (v + v_next) * dt;
            v = v_next;
            S[j] = s;
            V[j] = v;

            /* ---- collision risk (leaders) ---- */
            double g_new = new_lead - s;
            double g_own = both ? own_lead - s : c[FAR];
            double gap = np_min(g_new, g_own);
            int own_closer = g_own < g_new;
            double lead_v = own_closer ? own_v[j] : new_v[j];
            least_gap[j] = i == 0 ? gap : np_min(least_gap[j], gap);
            double desired = c[MIN_GAP] + (own_closer ? c[LEAVING_TIME_GAP] : new_time_gap) * v;
            double h = np_max(0.0, 1.0 - gap / desired);
            headway[j] += h * h;
            double closing = v - lead_v, risk = 0.0; /* not closing: ttc inf, risk max(0, -inf)^2 = 0 */
            if (closing > 1e-3) {
                double ttc = np_max(gap, 0.0) / np_max(closing, 1e-3);
                risk = np_max(0.0, 1.0 - ttc / c[TTC_MIN_S]);
                risk = risk * risk;
            }
            ttc_risk[j] = i == 0 ? risk : np_max(ttc_risk[j], risk);
            if (i == n_steps - 1) {
                end_speed[j] = v;
                end_gap[j] = g_new;
                end_lead_v[j] = lead_v;
            }

            /* ---- the new follower while the change is under way (only a change's counts) ---- */
            if (ch && during && rear_bad[j] == 0.0) {
                double rear_g = rear_gap[j] + s - rear_v[j] * ti;
                double rear_closing = rear_v[j] - v;
                int bad = rear_g < c[REAR_MIN_GAP];
                if (!bad && rear_closing > 1e-3) bad = rear_g / np_max(rear_closing, 1e-3) < c[REAR_MIN_TTC_S];
                if (bad) rear_bad[j] = 1.0;
            }

            /* ---- progress and comfort ---- */
            shortfall[j] += np_max(cruise[j] - v, 0.0);
            accel_sq[j] += a * a;
            if (i > 0) {
                double jerk = (a - A[j]) / dt;
                jerk_sq[j] += jerk * jerk;
            }
            A[j] = a;
            hard_brake[j] += np_max(0.0, -a - c[B_COMF]);

            /* ---- BehaviourPlanner._side_risk: slower cars close ahead in the next lanes ---- */
            for (int side = 0; side < 2; side++) {
                if (!near[side][j]) continue;
                double g = side_gap[side][j] + side_v[side][j] * ti - s;
                double cl = np_max(v - side_v[side][j], 0.0);
                double braking = cl * cl / (2.0 * np_max(g, c[CUT_IN_MIN_GAP]));
                double r = 0.0;
                if (g > 0.0) {
                    r = np_min(braking / c[B_COMF], 1.0);
                    r = r * r;
                }
                SIDE[side][j] = i == 0 ? r : np_max(SIDE[side][j], r);
            }
        }
    }
    /* numpy's mean: the sum over the rows divided by their count */
    const double rows = (double)n_steps, diffs = (double)(n_steps - 1);
    for (Py_ssize_t j = 0; j < n; j++) {
        headway[j] /= rows;
        shortfall[j] /= rows;
        accel_sq[j] /= rows;
        jerk_sq[j] /= diffs;
        hard_brake[j] /= rows;
        double risk = 0.0;
        for (int side = 0; side < 2; side++) risk = np_max(risk, near[side][j] ? SIDE[side][j] : 0.0);
        cut_in[j] = risk;
    }
    Py_END_ALLOW_THREADS

    PyMem_Free(state);
    release(&v);
    Py_RETURN_NONE;
fail:
    release(&v);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"outcome", (PyCFunction)(void (*)(void))outcome, METH_FASTCALL,
     "outcome(constants, t, v0, target, changing, cruise, own_gap, own_v, new_gap, new_v, rear_gap, rear_v, "
     "left_near, left_gap, left_v, right_near, right_gap, right_v, out): the rollout of every column and what it "
     "comes to, written into out (planner.behaviour._Outcome's rows)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rollout_module = {
    PyModuleDef_HEAD_INIT, "planner._rollout", "The behaviour planner's rollout in C (see planner.compiled).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rollout(void) { return PyModule_Create(&rollout_module); }

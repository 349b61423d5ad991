/* ood._signals: the per-signal checks' update (ood.signals.SignalMonitor._update), one session's
 * fresh observation at a time, in C.
 *
 * Why: the checks keep per-session state (runs, windows, tracks) that one observation moves on by a
 * few dozen branches; in Python that is 10-14 us per session per tick, the largest per-session cost
 * of a tick once a stream carries hundreds of agents. The Python path stays the reference and the
 * fallback (no compiler at install time, or DUALLOOP_SIGNALS_PURE_PYTHON=1).
 *
 * Every value is the Python path's, line by line: the same float64 operations in the same order
 * (built with -ffp-contract=off: no fused multiply-add), Python's max(a, b) as `b > a ? b : a` and
 * min(a, b) as `b < a ? b : a`, NaN comparisons as Python's (false), and the windows bounded to the
 * same 1,024 readings as the deques (the oldest leaves as one comes). tests/ood/test_signals_compiled.py
 * compares the bits on random, faulty and real-looking streams.
 *
 * CPython C API only: readings come in through the buffer protocol (C-contiguous float64 rows of
 * the five signals, int64 times), and scan()'s caller allocates the output.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEPT 1024 /* signals._MAX_KEPT: readings a window keeps at most */
#define N_CHECKS 10
#define SCORE_CAP 1e12 /* signals._SCORE_CAP */

/* The settings, in the order SignalMonitor._compiled_settings lists them (floats, then ns). */
enum Setting {
    MOVING_SPEED, STUCK_S, GAP_JUMP_M, GAP_FLOOR_M, NEW_LEAD_REL_JUMP, GAP_STEP_MAX_M, GAP_UNIT_FACTOR,
    GAP_UNIT_TOLERANCE, REL_SPAN_S, REL_FLOOR_M_S2, REL_UNIT_FACTOR, REL_UNIT_TOLERANCE, REL_UNIT_M_S,
    N_SETTINGS
};
enum Nanos { WINDOW_NS, FLICKER_NS, MAX_GAP_NS, GAP_WINDOW_NS, STEP_HOLD_NS, STEP_CONFIRM_NS, PRIOR_NS, HOLD_NS,
             SIGN_NS, N_NANOS };
enum Signal { SPEED, ACCEL, PRESENT, DISTANCE, REL };

static inline double py_max(double a, double b) { return b > a ? b : a; }
static inline double py_min(double a, double b) { return b < a ? b : a; }

/* A deque of (ns, a, b) with maxlen MAX_KEPT: the buffer grows as readings come. */
typedef struct {
    int64_t *t;
    double *a, *b;
    int cap, head, len;
} Ring;

static int ring_grow(Ring *r) {
    int cap = r->cap ? 2 * r->cap : 16;
    if (cap > MAX_KEPT) cap = MAX_KEPT;
    int64_t *t = PyMem_Malloc(sizeof(int64_t) * cap);
    double *a = PyMem_Malloc(sizeof(double) * cap), *b = PyMem_Malloc(sizeof(double) * cap);
    if (!t || !a || !b) {
        PyMem_Free(t), PyMem_Free(a), PyMem_Free(b);
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < r->len; k++) {
        int j = (r->head + k) % r->cap;
        t[k] = r->t[j], a[k] = r->a[j], b[k] = r->b[j];
    }
    PyMem_Free(r->t), PyMem_Free(r->a), PyMem_Free(r->b);
    r->t = t, r->a = a, r->b = b, r->cap = cap, r->head = 0;
    return 0;
}

static inline int at(const Ring *r, int k) { return (r->head + k) % r->cap; }

static int ring_append(Ring *r, int64_t t, double a, double b) {
    if (r->len == r->cap && r->cap < MAX_KEPT && ring_grow(r) < 0) return -1;
    if (r->len == MAX_KEPT) { /* a full deque drops its oldest */
        r->head = (r->head + 1) % r->cap;
        r->len--;
    }
    int j = (r->head + r->len) % r->cap;
    r->t[j] = t, r->a[j] = a, r->b[j] = b;
    r->len++;
    return 0;
}

static inline void ring_popleft(Ring *r) {
    r->head = (r->head + 1) % r->cap;
    r->len--;
}

static void ring_free(Ring *r) {
    PyMem_Free(r->t), PyMem_Free(r->a), PyMem_Free(r->b);
    memset(r, 0, sizeof(*r));
}

/* signals._TopTwo: the two largest values of a sliding window, keeping only those that may still be one. */
typedef struct {
    int64_t *t, *num;
    double *v;
    char *later; /* a later value at least as large was seen */
    int n, cap;
    int64_t added;
    int max_kept; /* 0: none */
    double second;
    int second_known;
} TopTwo;

static void top_clear(TopTwo *w) {
    w->n = 0, w->added = 0, w->second = 0.0, w->second_known = 1;
}

static int top_expire(TopTwo *w, int64_t t, int64_t span) {
    int n = 0;
    while (n < w->n && t - w->t[n] >= span) n++;
    if (n) {
        memmove(w->t, w->t + n, sizeof(int64_t) * (w->n - n));
        memmove(w->num, w->num + n, sizeof(int64_t) * (w->n - n));
        memmove(w->v, w->v + n, sizeof(double) * (w->n - n));
        memmove(w->later, w->later + n, w->n - n);
        w->n -= n;
        w->second_known = 0;
    }
    return n > 0;
}

static int top_add(TopTwo *w, int64_t t, double value) {
    int kept = 0;
    for (int k = 0; k < w->n; k++) {
        if (w->v[k] <= value) {
            if (w->later[k]) continue; /* its second later reading at least as large */
            w->later[k] = 1;
        }
        w->t[kept] = w->t[k], w->num[kept] = w->num[k], w->v[kept] = w->v[k], w->later[kept] = w->later[k];
        kept++;
    }
    w->n = kept;
    if (w->max_kept && kept && w->num[0] < w->added + 1 - w->max_kept) { /* the bounded window's oldest */
        memmove(w->t, w->t + 1, sizeof(int64_t) * (kept - 1));
        memmove(w->num, w->num + 1, sizeof(int64_t) * (kept - 1));
        memmove(w->v, w->v + 1, sizeof(double) * (kept - 1));
        memmove(w->later, w->later + 1, kept - 1);
        w->n = --kept;
    }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 8;
        int64_t *tt = PyMem_Realloc(w->t, sizeof(int64_t) * cap);
        if (tt) w->t = tt;
        int64_t *nn = PyMem_Realloc(w->num, sizeof(int64_t) * cap);
        if (nn) w->num = nn;
        double *vv = PyMem_Realloc(w->v, sizeof(double) * cap);
        if (vv) w->v = vv;
        char *ll = PyMem_Realloc(w->later, cap);
        if (ll) w->later = ll;
        if (!tt || !nn || !vv || !ll) {
            PyErr_NoMemory();
            return -1;
        }
        w->cap = cap;
    }
    w->t[w->n] = t, w->v[w->n] = value, w->later[w->n] = 0, w->num[w->n] = w->added;
    w->n++;
    w->added++;
    w->second_known = 0;
    return 0;
}

static double top_second(TopTwo *w) {
    if (!w->second_known) {
        double first = -INFINITY, second = -INFINITY;
        for (int k = 0; k < w->n; k++) {
            double v = w->v[k];
            if (v > first)
                second = first, first = v;
            else if (v > second)
                second = v;
        }
        w->second = w->n >= 2 ? second : 0.0;
        w->second_known = 1;
    }
    return w->second;
}

static void top_free(TopTwo *w) {
    PyMem_Free(w->t), PyMem_Free(w->num), PyMem_Free(w->v), PyMem_Free(w->later);
    w->t = w->num = NULL, w->v = NULL, w->later = NULL, w->cap = 0;
    top_clear(w);
}

/* signals._Slot: one session's memory. Booleans stand for Python's None. */
typedef struct {
    int64_t t;
    double last[5];
    int64_t run_start[3];
    Ring window; /* (ns, speed, accel integral) */
    double integral;
    int has_gap;
    int64_t gap_t;
    double gap_g, gap_r;
    TopTwo jumps;
    Ring toggles; /* (ns, -, -) */
    double present;
    double rep_integral[2]; /* per pair: the integrated signal's run (NaN: none) */
    int rep_has_run[2];     /* ... and the rate's run: (x, rate, ns) when it began */
    double rep_x[2], rep_rate[2];
    int64_t rep_t[2];
    double ref, prior;
    int64_t prior_t, step_t;
    int has_rel_last;
    int64_t rl_t;
    double rl_g, rl_r;
    TopTwo rel_top;
    double rel_score;
    int has_unit; /* _UnitRun */
    double unit_step, unit_integral;
    int64_t unit_t;
    Ring unit_recent; /* (ns, gap, integral) */
    double rel_before;
    Ring trend; /* (ns, gap, integral) */
    double out[N_CHECKS];
    PyObject *out_tuple; /* out as the tuple step() returns (NULL: to be made) */
    int measures[5];
} Slot;

static void slot_clear(Slot *s) {
    s->t = -1;
    for (int k = 0; k < 5; k++) s->last[k] = NAN;
    for (int k = 0; k < 3; k++) s->run_start[k] = -1;
    s->window.len = 0, s->window.head = 0;
    s->integral = 0.0;
    s->has_gap = 0;
    top_clear(&s->jumps);
    s->toggles.len = 0, s->toggles.head = 0;
    s->present = NAN;
    for (int k = 0; k < 2; k++) s->rep_integral[k] = NAN, s->rep_has_run[k] = 0;
    s->ref = NAN, s->prior = NAN, s->prior_t = -1, s->step_t = -1;
    s->has_rel_last = 0;
    top_clear(&s->rel_top);
    s->rel_score = 0.0;
    s->has_unit = 0;
    s->unit_recent.len = 0, s->unit_recent.head = 0;
    s->rel_before = NAN;
    s->trend.len = 0, s->trend.head = 0;
    for (int k = 0; k < N_CHECKS; k++) s->out[k] = NAN;
    Py_CLEAR(s->out_tuple);
}

typedef struct {
    PyObject_HEAD
    double c[N_SETTINGS];
    int64_t ns[N_NANOS];
    double thresholds[N_CHECKS]; /* a score above its check's vetoes (SignalSettings.thresholds) */
    Py_ssize_t n_slots;
    Slot *slots;
} Checks;

/* SignalMonitor._stuck */
static double stuck_check(Slot *st, const double *c, int64_t t, const double *values, const double *last) {
    double speed = values[SPEED];
    int moving = speed == speed && fabs(speed) > c[MOVING_SPEED] && st->t >= 0;
    int lead = moving && st->measures[PRESENT] && values[PRESENT] == 1.0;
    double stuck = 0.0;
    const int idx[3] = {SPEED, DISTANCE, REL};
    const int judged[3] = {moving, lead && st->measures[DISTANCE], lead && st->measures[REL]};
    for (int j = 0; j < 3; j++) {
        if (judged[j] && values[idx[j]] == last[idx[j]]) { /* a repeat */
            if (st->run_start[j] < 0) st->run_start[j] = st->t;
            stuck = py_max(stuck, (double)(t - st->run_start[j]) * 1e-9);
        } else {
            st->run_start[j] = -1;
        }
    }
    return stuck;
}

/* SignalMonitor._repeat, pair j */
static double repeat_check(Slot *st, int j, int64_t t0, int64_t t, double x, double rate, double x0, double rate0,
                           int judged) {
    if (!(judged && t0 >= 0 && x == x && rate == rate && x0 == x0 && rate0 == rate0)) {
        st->rep_integral[j] = NAN, st->rep_has_run[j] = 0;
        return (x != x || rate != rate) ? NAN : 0.0;
    }
    double score = 0.0;
    if (x == x0) {
        double before = st->rep_integral[j];
        double integral = (before == before ? before : 0.0) + 0.5 * (rate + rate0) * ((double)(t - t0) * 1e-9);
        st->rep_integral[j] = integral;
        score = fabs(integral);
    } else {
        st->rep_integral[j] = NAN;
    }
    if (rate == rate0) {
        if (!st->rep_has_run[j]) st->rep_has_run[j] = 1, st->rep_x[j] = x0, st->rep_rate[j] = rate0, st->rep_t[j] = t0;
        score = py_max(score, fabs((x - st->rep_x[j]) - st->rep_rate[j] * ((double)(t - st->rep_t[j]) * 1e-9)));
    } else {
        st->rep_has_run[j] = 0;
    }
    return score;
}

/* SignalMonitor._unit_step */
static int unit_step(const double *c, double distance, double predicted) {
    return predicted > 0.0 && fabs(distance / (predicted * c[GAP_UNIT_FACTOR]) - 1.0) <= c[GAP_UNIT_TOLERANCE];
}

/* SignalMonitor._gap_step */
static double gap_step_check(Checks *m, Slot *st, int64_t t, const double *values, const double *last,
                             double gap_stuck_s) {
    const double *c = m->c;
    double present = values[PRESENT], distance = values[DISTANCE], rel = values[REL];
    if (!(present == 1.0 && distance == distance && rel == rel)) {
        st->ref = NAN, st->step_t = -1, st->prior = NAN;
        return NAN;
    }
    double g0 = last[DISTANCE], r0 = last[REL];
    if (st->t < 0 || last[PRESENT] != 1.0 || g0 != g0 || r0 != r0 || st->ref != st->ref) {
        st->ref = distance, st->step_t = -1, st->prior = NAN;
        return 0.0;
    }
    double moved = 0.5 * (rel + r0) * ((double)(t - st->t) * 1e-9);
    double step = (distance - g0) - moved;
    int jump = fabs(step) >= c[GAP_JUMP_M];
    int new_lead = jump && fabs(rel - r0) >= c[NEW_LEAD_REL_JUMP] && distance != 0.0;
    int young = st->step_t >= 0 && t - st->step_t < m->ns[STEP_CONFIRM_NS];
    double predicted = st->ref + moved;
    if (st->prior == st->prior) st->prior = t - st->prior_t <= m->ns[PRIOR_NS] ? st->prior + moved : NAN;
    int unit = !new_lead && unit_step(c, distance, predicted);
    int new_target = jump && fabs(step) >= c[GAP_STEP_MAX_M] && !unit && distance != 0.0;
    if (new_target || (jump && gap_stuck_s > c[STUCK_S]) || (new_lead && young)) {
        if (st->prior != st->prior) st->prior = predicted, st->prior_t = t;
        st->ref = distance, st->step_t = -1;
        return 0.0;
    }
    if (new_lead) predicted += step;
    double off = fabs(distance - predicted);
    if (off >= c[GAP_JUMP_M] && fabs(distance - st->prior) < c[GAP_JUMP_M]) {
        off = fabs(distance - st->prior);
        st->prior = NAN;
    }
    if (off < c[GAP_JUMP_M]) {
        st->ref = distance, st->step_t = -1;
        return off;
    }
    st->ref = predicted;
    if (st->step_t < 0) {
        st->step_t = t;
    } else if (t - st->step_t > m->ns[STEP_HOLD_NS]) {
        st->ref = distance, st->step_t = -1;
        return 0.0;
    }
    return off;
}

/* SignalMonitor._speed_accel (-2: out of memory) */
static double speed_accel_check(Checks *m, Slot *st, int64_t t, const double *values, const double *last, int *err) {
    double speed = values[SPEED], accel = values[ACCEL];
    Ring *w = &st->window;
    if (!(speed == speed && accel == accel)) {
        w->len = 0, w->head = 0;
        st->integral = 0.0;
        return NAN;
    }
    if (w->len) {
        int64_t dt_ns = st->t >= 0 ? t - st->t : 0;
        st->integral += 0.5 * (accel + last[ACCEL]) * ((double)dt_ns * 1e-9);
    }
    if (ring_append(w, t, speed, st->integral) < 0) return *err = 1, NAN;
    while (w->len > 2 && t - w->t[at(w, 1)] >= m->ns[WINDOW_NS]) ring_popleft(w);
    int j = at(w, 0);
    return t - w->t[j] >= m->ns[WINDOW_NS] ? fabs((speed - w->a[j]) - (st->integral - w->b[j])) : NAN;
}

/* SignalMonitor._rel_accel */
static double rel_accel_check(Checks *m, Slot *st, int64_t t, const double *values, int *err) {
    const double *c = m->c;
    double present = values[PRESENT], distance = values[DISTANCE], rel = values[REL];
    if (!(present == 1.0 && distance == distance && rel == rel)) {
        st->has_rel_last = 0;
        top_clear(&st->rel_top);
        st->rel_score = 0.0;
        return NAN;
    }
    int had = st->has_rel_last;
    int64_t t1 = st->rl_t;
    double g1 = st->rl_g, r1 = st->rl_r;
    st->has_rel_last = 1, st->rl_t = t, st->rl_g = distance, st->rl_r = rel;
    TopTwo *top = &st->rel_top;
    int changed = top->n && t - top->t[0] >= m->ns[HOLD_NS] && top_expire(top, t, m->ns[HOLD_NS]);
    if (had) {
        double dt = (double)(t - t1) * 1e-9;
        if (fabs((distance - g1) - 0.5 * (rel + r1) * dt) < c[GAP_JUMP_M]) {
            double rate = fabs(rel - r1) / py_max(dt, c[REL_SPAN_S]);
            if (rate >= c[REL_FLOOR_M_S2]) {
                if (top_add(top, t, rate) < 0) return *err = 1, NAN;
                changed = 1;
            }
        }
    }
    if (changed) st->rel_score = top_second(top);
    return st->rel_score;
}

/* _UnitRun.advance: whether the run ends */
static int unit_advance(Checks *m, Slot *st, double rel, double r0, double distance, int64_t t, double dt, int *err) {
    const double *c = m->c;
    double factor = c[REL_UNIT_FACTOR];
    if (fabs(rel - r0 / factor) <= 0.25 * fabs(rel - r0) || fabs(rel - r0) > 0.5 * st->unit_step) return 1;
    st->unit_integral += 0.5 * (rel + r0) * dt;
    Ring *r = &st->unit_recent;
    if (ring_append(r, t, distance, st->unit_integral) < 0) return *err = 1, 1;
    while (r->len > 2 && t - r->t[at(r, 1)] >= m->ns[GAP_WINDOW_NS]) ring_popleft(r);
    int j = at(r, 0);
    double moved = distance - r->a[j], integral = st->unit_integral - r->b[j];
    double as_read = fabs(moved - integral), divided = fabs(moved - integral / factor);
    if (divided - as_read >= c[GAP_FLOOR_M]) return 1;
    return t - st->unit_t > m->ns[STEP_HOLD_NS] && !(as_read - divided >= c[GAP_FLOOR_M]);
}

/* SignalMonitor._rel_unit */
static double rel_unit_check(Checks *m, Slot *st, int64_t t, const double *values, const double *last, double stuck_s,
                             int *err) {
    const double *c = m->c;
    double present = values[PRESENT], distance = values[DISTANCE], rel = values[REL];
    double r0 = last[REL], g0 = last[DISTANCE];
    double before = st->rel_before;
    st->rel_before = r0;
    if (!(present == 1.0 && distance == distance && rel == rel)) {
        st->has_unit = 0, st->rel_before = NAN;
        return NAN;
    }
    if (!(st->t >= 0 && last[PRESENT] == 1.0 && r0 == r0 && g0 == g0)) {
        st->has_unit = 0, st->rel_before = NAN;
        return 0.0;
    }
    double factor = c[REL_UNIT_FACTOR];
    double dt = (double)(t - st->t) * 1e-9;
    int new_lead = fabs((distance - g0) - 0.5 * (rel + r0) * dt) >= c[GAP_JUMP_M];
    if (st->has_unit) {
        if (new_lead || unit_advance(m, st, rel, r0, distance, t, dt, err)) st->has_unit = 0;
        return st->has_unit ? st->unit_step : 0.0;
    }
    double expected = before == before ? 2.0 * r0 - before : r0;
    double step = fabs(rel - r0);
    int unit = fabs(rel - expected * factor) <= c[REL_UNIT_TOLERANCE] * fabs(expected * factor);
    unit = unit && !(fabs(rel - before) <= c[REL_UNIT_M_S]);
    if (!new_lead && step > c[REL_UNIT_M_S] && unit && stuck_s <= c[STUCK_S]) {
        double integral = 0.5 * (rel + r0) * dt;
        st->has_unit = 1, st->unit_step = step, st->unit_t = t, st->unit_integral = integral;
        Ring *r = &st->unit_recent;
        r->len = 0, r->head = 0;
        if (ring_append(r, st->t, g0, 0.0) < 0 || ring_append(r, t, distance, integral) < 0) return *err = 1, NAN;
        return step;
    }
    return 0.0;
}

/* SignalMonitor._rel_sign */
static double rel_sign_check(Checks *m, Slot *st, int64_t t, const double *values, const double *last, int *err) {
    double present = values[PRESENT], distance = values[DISTANCE], rel = values[REL];
    Ring *trend = &st->trend;
    if (!(present == 1.0 && distance == distance && rel == rel)) {
        trend->len = 0, trend->head = 0;
        return NAN;
    }
    double integral = 0.0;
    if (trend->len) {
        double moved = 0.5 * (rel + last[REL]) * ((double)(t - st->t) * 1e-9);
        if (fabs((distance - last[DISTANCE]) - moved) >= m->c[GAP_JUMP_M])
            trend->len = 0, trend->head = 0;
        else
            integral = trend->b[at(trend, trend->len - 1)] + moved;
    }
    if (ring_append(trend, t, distance, integral) < 0) return *err = 1, NAN;
    while (trend->len > 2 && t - trend->t[at(trend, 1)] >= m->ns[SIGN_NS]) ring_popleft(trend);
    int j = at(trend, 0);
    double change = distance - trend->a[j];
    integral = integral - trend->b[j];
    if (change * integral >= 0.0) return 0.0;
    return py_min(fabs(change), fabs(integral));
}

/* SignalMonitor._gap_rate */
static double gap_rate_check(Checks *m, Slot *st, int64_t t, const double *values, double gap_stuck_s, int *err) {
    const double *c = m->c;
    double present = values[PRESENT], distance = values[DISTANCE], rel = values[REL];
    TopTwo *jumps = &st->jumps;
    if (!(present == 1.0 && distance == distance && rel == rel)) {
        st->has_gap = 0;
        top_clear(jumps);
        return NAN;
    }
    double gap_rate = 0.0;
    if (st->has_gap) {
        double g0 = st->gap_g, r0 = st->gap_r;
        double e = fabs((distance - g0) - 0.5 * (rel + r0) * ((double)(t - st->gap_t) * 1e-9));
        int new_lead = e >= c[GAP_JUMP_M] && (fabs(rel - r0) >= c[NEW_LEAD_REL_JUMP] || gap_stuck_s > c[STUCK_S]);
        if (new_lead)
            top_clear(jumps);
        else if (e >= c[GAP_FLOOR_M] && top_add(jumps, t, e) < 0)
            return *err = 1, NAN;
    }
    if (jumps->n && t - jumps->t[0] >= m->ns[GAP_WINDOW_NS]) top_expire(jumps, t, m->ns[GAP_WINDOW_NS]);
    if (jumps->n >= 2) gap_rate = top_second(jumps);
    st->has_gap = 1, st->gap_t = t, st->gap_g = distance, st->gap_r = rel;
    return gap_rate;
}

/* SignalMonitor._flicker */
static double flicker_check(Checks *m, Slot *st, int64_t t, double present, int *err) {
    Ring *toggles = &st->toggles;
    if (present != present) {
        toggles->len = 0, toggles->head = 0;
        st->present = NAN;
        return NAN;
    }
    if (st->present == st->present && present != st->present && ring_append(toggles, t, 0.0, 0.0) < 0)
        return *err = 1, NAN;
    st->present = present;
    while (toggles->len && t - toggles->t[at(toggles, 0)] >= m->ns[FLICKER_NS]) ring_popleft(toggles);
    return (double)toggles->len;
}

/* SignalMonitor._update: one fresh observation at t ns; the scores into st->out. -1: out of memory. */
static int update(Checks *m, Slot *st, int64_t t, const double *values) {
    const double *c = m->c;
    const int *me = st->measures;
    int err = 0;
    if (st->t >= 0 && (t - st->t > m->ns[MAX_GAP_NS] || t <= st->t)) slot_clear(st); /* a pause: nothing carries over */
    double last[5];
    memcpy(last, st->last, sizeof(last));
    double gap_stuck_s = st->run_start[1] >= 0 ? (double)(st->t - st->run_start[1]) * 1e-9 : 0.0;
    double rel_stuck_s = st->run_start[2] >= 0 ? (double)(st->t - st->run_start[2]) * 1e-9 : 0.0;
    int lead_signals = me[PRESENT] && me[DISTANCE] && me[REL];
    double stuck = me[SPEED] ? stuck_check(st, c, t, values, last) : NAN;
    double speed_accel = me[SPEED] && me[ACCEL] ? speed_accel_check(m, st, t, values, last, &err) : NAN;
    double gap_rate = lead_signals ? gap_rate_check(m, st, t, values, gap_stuck_s, &err) : NAN;
    double flicker = me[PRESENT] ? flicker_check(m, st, t, values[PRESENT], &err) : NAN;
    double speed_repeat = NAN, gap_repeat = NAN, gap_step = NAN;
    if (me[SPEED] && me[ACCEL]) {
        int moving = fabs(values[SPEED]) > c[MOVING_SPEED];
        speed_repeat = repeat_check(st, 0, st->t, t, values[SPEED], values[ACCEL], last[SPEED], last[ACCEL], moving);
    }
    if (lead_signals && values[PRESENT] != 1.0) {
        st->rep_integral[1] = NAN, st->rep_has_run[1] = 0;
    } else if (lead_signals) {
        int lead = fabs(values[SPEED]) > c[MOVING_SPEED] && last[PRESENT] == 1.0;
        gap_repeat = repeat_check(st, 1, st->t, t, values[DISTANCE], values[REL], last[DISTANCE], last[REL], lead);
    }
    double rel_accel = NAN, rel_unit = NAN, rel_sign = NAN;
    if (lead_signals) {
        gap_step = gap_step_check(m, st, t, values, last, gap_stuck_s);
        rel_unit = rel_unit_check(m, st, t, values, last, rel_stuck_s, &err);
        rel_accel = rel_accel_check(m, st, t, values, &err);
        rel_sign = rel_sign_check(m, st, t, values, last, &err);
    }
    if (err) return -1;
    st->t = t;
    memcpy(st->last, values, sizeof(st->last));
    double *out = st->out;
    out[0] = stuck, out[1] = speed_accel, out[2] = gap_rate, out[3] = flicker, out[4] = speed_repeat;
    out[5] = gap_repeat, out[6] = gap_step, out[7] = rel_accel, out[8] = rel_unit, out[9] = rel_sign;
    for (int k = 0; k < N_CHECKS; k++)
        if (out[k] > SCORE_CAP) out[k] = SCORE_CAP; /* finite by contract; NaN stays no verdict */
    Py_CLEAR(st->out_tuple);
    return 0;
}

static PyObject *out_tuple(Slot *st) {
    if (st->out_tuple == NULL) {
        PyObject *tup = PyTuple_New(N_CHECKS);
        if (tup == NULL) return NULL;
        for (int k = 0; k < N_CHECKS; k++) {
            PyObject *v = PyFloat_FromDouble(st->out[k]);
            if (v == NULL) {
                Py_DECREF(tup);
                return NULL;
            }
            PyTuple_SET_ITEM(tup, k, v);
        }
        st->out_tuple = tup;
    }
    Py_INCREF(st->out_tuple);
    return st->out_tuple;
}

static int as_slot(Checks *m, PyObject *obj, Py_ssize_t *slot) {
    Py_ssize_t s = PyNumber_AsSsize_t(obj, PyExc_IndexError);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (s < 0 || s >= m->n_slots) {
        PyErr_Format(PyExc_IndexError, "slot %zd outside 0..%zd", s, m->n_slots - 1);
        return -1;
    }
    *slot = s;
    return 0;
}

/* a C-contiguous buffer of items of `itemsize` bytes whose format is one of `formats` */
static int take(PyObject *obj, Py_buffer *b, const char *name, Py_ssize_t itemsize, const char *kind, int writable) {
    int want = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, want) < 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '=' || *f == '<' || *f == '@') f++;
    int ok = b->itemsize == itemsize && (strcmp(f, kind) == 0 || (itemsize == 8 && kind[0] == 'q' && strcmp(f, "l") == 0));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous %s array", name, kind[0] == 'd' ? "float64" : "int64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* step(x, slots, fresh, times, veto) -> list of score tuples: x (rows, 5) float64, the rest sequences of
 * rows; veto, a list of rows or None, is set True where a score is above its threshold */
static PyObject *checks_step(Checks *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "step() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *veto = args[4] == Py_None ? NULL : args[4];
    if (veto && !PyList_Check(veto)) {
        PyErr_SetString(PyExc_TypeError, "veto: expected a list or None");
        return NULL;
    }
    Py_buffer xb;
    if (take(args[0], &xb, "x", 8, "d", 0) < 0) return NULL;
    PyObject *slots = NULL, *fresh = NULL, *times = NULL, *result = NULL;
    const double *x = xb.buf;
    Py_ssize_t rows = xb.len / (5 * 8);
    if (xb.len != rows * 5 * 8) {
        PyErr_SetString(PyExc_ValueError, "x: expected (rows, 5) readings");
        goto done;
    }
    slots = PySequence_Fast(args[1], "slots: expected a sequence");
    fresh = slots ? PySequence_Fast(args[2], "fresh: expected a sequence") : NULL;
    times = fresh ? PySequence_Fast(args[3], "times: expected a sequence") : NULL;
    if (times == NULL) goto done;
    if (PySequence_Fast_GET_SIZE(slots) != rows || PySequence_Fast_GET_SIZE(fresh) != rows ||
        PySequence_Fast_GET_SIZE(times) != rows || (veto && PyList_GET_SIZE(veto) != rows)) {
        PyErr_SetString(PyExc_ValueError, "slots, fresh, times and veto: one item per row of x");
        goto done;
    }
    result = PyList_New(rows);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < rows; i++) {
        Py_ssize_t slot;
        if (as_slot(m, PySequence_Fast_GET_ITEM(slots, i), &slot) < 0) goto fail;
        Slot *st = &m->slots[slot];
        int is_fresh = PyObject_IsTrue(PySequence_Fast_GET_ITEM(fresh, i));
        if (is_fresh < 0) goto fail;
        if (is_fresh) {
            long long t = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(times, i));
            if (t == -1 && PyErr_Occurred()) goto fail;
            if (update(m, st, (int64_t)t, x + 5 * i) < 0) {
                PyErr_NoMemory();
                goto fail;
            }
        }
        PyObject *tup = out_tuple(st);
        if (tup == NULL) goto fail;
        PyList_SET_ITEM(result, i, tup);
        int over = 0;
        for (int k = 0; k < N_CHECKS; k++) over |= st->out[k] > m->thresholds[k]; /* NaN: no verdict */
        if (veto && over && PyList_SetItem(veto, i, Py_NewRef(Py_True)) < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(slots), Py_XDECREF(fresh), Py_XDECREF(times);
    PyBuffer_Release(&xb);
    return result;
}

/* scan(x, slot, times, out): a slot's fresh observations in turn, each row's scores into out (rows, 10) */
static PyObject *checks_scan(Checks *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "scan() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t slot;
    if (as_slot(m, args[1], &slot) < 0) return NULL;
    Py_buffer xb, tb, ob;
    if (take(args[0], &xb, "x", 8, "d", 0) < 0) return NULL;
    if (take(args[2], &tb, "times", 8, "q", 0) < 0) {
        PyBuffer_Release(&xb);
        return NULL;
    }
    if (take(args[3], &ob, "out", 8, "d", 1) < 0) {
        PyBuffer_Release(&xb), PyBuffer_Release(&tb);
        return NULL;
    }
    Py_ssize_t rows = tb.len / 8;
    PyObject *result = NULL;
    if (xb.len != rows * 5 * 8 || ob.len != rows * N_CHECKS * 8) {
        PyErr_SetString(PyExc_ValueError, "x (rows, 5), times (rows,) and out (rows, 10): the same rows");
        goto done;
    }
    Slot *st = &m->slots[slot];
    const double *x = xb.buf;
    const int64_t *t = tb.buf;
    double *out = ob.buf;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (update(m, st, t[i], x + 5 * i) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(out + N_CHECKS * i, st->out, sizeof(st->out));
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&xb), PyBuffer_Release(&tb), PyBuffer_Release(&ob);
    return result;
}

/* five truths (speed, accel, present, distance, rel): which signals a session measures */
static int as_measures(PyObject *obj, int *got) {
    PyObject *seq = PySequence_Fast(obj, "measures: expected five truths");
    if (seq == NULL) return -1;
    int ok = PySequence_Fast_GET_SIZE(seq) == 5;
    if (!ok) PyErr_SetString(PyExc_ValueError, "measures: expected five truths");
    for (int k = 0; ok && k < 5; k++) {
        got[k] = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, k));
        ok = got[k] >= 0;
    }
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

/* (slot, measures) -> the slot's new measures; `clear`: the slot starts afresh too */
static PyObject *set_measures(Checks *m, PyObject *const *args, Py_ssize_t nargs, const char *name, int clear) {
    Py_ssize_t slot;
    int got[5];
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 2 arguments (%zd given)", name, nargs);
        return NULL;
    }
    if (as_slot(m, args[0], &slot) < 0 || as_measures(args[1], got) < 0) return NULL;
    if (clear) slot_clear(&m->slots[slot]);
    memcpy(m->slots[slot].measures, got, sizeof(got));
    Py_RETURN_NONE;
}

/* reset(slot, measures): the slot starts afresh, its session measuring these signals */
static PyObject *checks_reset(Checks *m, PyObject *const *args, Py_ssize_t nargs) {
    return set_measures(m, args, nargs, "reset", 1);
}

/* measure(slot, measures): which signals the slot's session measures */
static PyObject *checks_measure(Checks *m, PyObject *const *args, Py_ssize_t nargs) {
    return set_measures(m, args, nargs, "measure", 0);
}

static void slot_free(Slot *s) {
    ring_free(&s->window), ring_free(&s->toggles), ring_free(&s->unit_recent), ring_free(&s->trend);
    top_free(&s->jumps), top_free(&s->rel_top);
    Py_CLEAR(s->out_tuple);
}

/* `count` numbers of a sequence into doubles or int64s (ints set): 0, or -1 with the error set */
static int as_numbers(PyObject *obj, const char *name, int count, double *doubles, int64_t *ints) {
    char message[64];
    snprintf(message, sizeof(message), "%s: expected a sequence of %d numbers", name, count);
    PyObject *seq = PySequence_Fast(obj, message);
    if (seq == NULL) return -1;
    int ok = PySequence_Fast_GET_SIZE(seq) == count;
    if (!ok) PyErr_Format(PyExc_ValueError, "%s: expected %d values", name, count);
    for (int k = 0; ok && k < count; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (ints)
            ints[k] = PyLong_AsLongLong(item);
        else
            doubles[k] = PyFloat_AsDouble(item);
        ok = !PyErr_Occurred();
    }
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

static int checks_init(Checks *m, PyObject *args, PyObject *kwds) {
    Py_ssize_t n_slots;
    PyObject *settings, *nanos, *thresholds;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Checks() takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "nOOO", &n_slots, &settings, &nanos, &thresholds)) return -1;
    if (n_slots < 0) {
        PyErr_SetString(PyExc_ValueError, "n_slots must be >= 0");
        return -1;
    }
    if (as_numbers(settings, "settings", N_SETTINGS, m->c, NULL) < 0 ||
        as_numbers(nanos, "nanos", N_NANOS, NULL, m->ns) < 0 ||
        as_numbers(thresholds, "thresholds", N_CHECKS, m->thresholds, NULL) < 0)
        return -1;
    Slot *slots = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < m->n_slots; k++) slot_free(&m->slots[k]);
    PyMem_Free(m->slots);
    m->slots = slots, m->n_slots = n_slots;
    for (Py_ssize_t k = 0; k < n_slots; k++) {
        slots[k].jumps.max_kept = MAX_KEPT;
        slot_clear(&slots[k]);
        for (int j = 0; j < 5; j++) slots[k].measures[j] = 1;
    }
    return 0;
}

static void checks_dealloc(Checks *m) {
    PyTypeObject *tp = Py_TYPE(m);
    for (Py_ssize_t k = 0; k < m->n_slots; k++) slot_free(&m->slots[k]);
    PyMem_Free(m->slots);
    tp->tp_free((PyObject *)m);
    Py_DECREF(tp);
}

static PyMethodDef checks_methods[] = {
    {"step", (PyCFunction)(void (*)(void))checks_step, METH_FASTCALL,
     "step(x, slots, fresh, times, veto): each row's ten scores after this tick (x: (rows, 5) float64 "
     "readings); veto[i] = True where row i's scores veto"},
    {"scan", (PyCFunction)(void (*)(void))checks_scan, METH_FASTCALL,
     "scan(x, slot, times, out): a slot's fresh observations in turn, the scores after each into out"},
    {"reset", (PyCFunction)(void (*)(void))checks_reset, METH_FASTCALL,
     "reset(slot, measures): the slot starts afresh, measuring these signals"},
    {"measure", (PyCFunction)(void (*)(void))checks_measure, METH_FASTCALL,
     "measure(slot, measures): which of the five signals the slot's session measures"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot checks_type_slots[] = {
    {Py_tp_doc, "Checks(n_slots, settings, nanos, thresholds): the per-signal checks' state for n_slots sessions"},
    {Py_tp_init, checks_init},
    {Py_tp_dealloc, checks_dealloc},
    {Py_tp_methods, checks_methods},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec checks_spec = {"ood._signals.Checks", sizeof(Checks), 0, Py_TPFLAGS_DEFAULT, checks_type_slots};

static struct PyModuleDef signals_module = {
    PyModuleDef_HEAD_INIT, "ood._signals", "The per-signal checks' update in C (see ood.signals).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__signals(void) {
    PyObject *mod = PyModule_Create(&signals_module);
    if (mod == NULL) return NULL;
    PyObject *tp = PyType_FromSpec(&checks_spec);
    if (tp == NULL || PyModule_AddObject(mod, "Checks", tp) < 0) {
        Py_XDECREF(tp);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}

"""A float32 numpy MLP with a shared ReLU trunk and two heads, trained with Adam.

trunk: x -> [Linear -> ReLU]* -> decision vector (the last hidden layer, what the OOD gate scores)
heads: decision vector -> logits (weighted cross-entropy on the discrete action)
       decision vector -> controls (MSE on accel and steer, each scaled by its range)

The controls head is trained in range-scaled units u = (y - centre) / range, so both controls weigh
the same and the head is well conditioned; `to_weights` folds the scaling back in, so the exported
graph outputs physical units (m/s^2, rad), which is what the executor clips and applies.
Deterministic for a seed: one RNG for init and shuffling, and BLAS pinned to one thread by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from dualloop.executor.onnx_export import MLPWeights
from dualloop.sim import schema

F32 = npt.NDArray[np.float32]
CTRL_LOW = np.array([c.low for c in schema.CONTROLS], np.float32)
CTRL_HIGH = np.array([c.high for c in schema.CONTROLS], np.float32)
CTRL_RANGE = CTRL_HIGH - CTRL_LOW
CTRL_CENTRE = (CTRL_HIGH + CTRL_LOW) / np.float32(2.0)


@dataclass(frozen=True)
class MLPConfig:
    hidden: tuple[int, ...] = (64, 64)
    lr: float = 2e-3
    batch_size: int = 256
    max_epochs: int = 30
    patience: int = 10  # epochs without a better validation loss before stopping
    weight_decay: float = 0.1  # decoupled (AdamW): ~10 % shrink over a run; curbs memorising episodes
    control_weight: float = 4.0  # controls MSE is in (range units)^2: ~100x smaller than the CE
    class_weight_power: float = 0.6  # 0: unweighted, 1: fully balanced; 0.6 lifts brake_hard
    # without wrecking the calibration of the common classes


def scale_controls(controls: np.ndarray) -> F32:
    return ((np.asarray(controls, np.float32) - CTRL_CENTRE) / CTRL_RANGE).astype(np.float32)


def class_weights(labels: npt.NDArray[np.int64], power: float, row_weight: F32 | None = None) -> F32:
    """(n / (K n_c))^power, normalised to a sample-weighted mean of 1; an absent class gets 0.
    With row weights, n and n_c are weighted counts."""
    counts = np.bincount(labels, weights=row_weight, minlength=schema.N_ACTIONS).astype(np.float64)
    present = counts > 0
    w = np.zeros_like(counts)
    w[present] = (counts.sum() / (present.sum() * counts[present])) ** power
    w /= (w * counts).sum() / counts.sum()
    return w.astype(np.float32)


class MLP:
    """Parameters as one flat list [W0, b0, ..., W_logits, b_logits, W_ctrl, b_ctrl]."""

    def __init__(
        self, n_in: int, hidden: tuple[int, ...], n_actions: int, n_controls: int, rng: np.random.Generator
    ) -> None:
        self.params: list[F32] = []
        width = n_in
        for h in hidden:
            self.params += [_he(rng, width, h), np.zeros(h, np.float32)]
            width = h
        # Small heads: start near uniform probabilities and near-centre controls.
        self.params += [(_he(rng, width, n_actions) * np.float32(0.1)), np.zeros(n_actions, np.float32)]
        self.params += [(_he(rng, width, n_controls) * np.float32(0.1)), np.zeros(n_controls, np.float32)]
        self.n_hidden = len(hidden)

    def forward(self, x: F32) -> tuple[F32, F32, list[F32]]:
        """Returns logits, scaled controls, and the trunk activations [x, h1, ..., decision vector]."""
        acts = [x]
        h = x
        for i in range(self.n_hidden):
            h = h @ self.params[2 * i] + self.params[2 * i + 1]
            np.maximum(h, 0, out=h)
            acts.append(h)
        k = 2 * self.n_hidden
        logits = h @ self.params[k] + self.params[k + 1]
        ctrl = h @ self.params[k + 2] + self.params[k + 3]
        return logits, ctrl, acts

    def loss_grads(
        self, x: F32, y: npt.NDArray[np.int64], u: F32, cw: F32, control_weight: float, rw: F32 | None = None
    ) -> tuple[float, list[F32]]:
        """rw: per-row weights (None: all 1); a NaN control target is left out of the controls loss."""
        logits, ctrl, acts = self.forward(x)
        n = x.shape[0]
        p = softmax(logits)
        w = cw[y] if rw is None else cw[y] * rw
        wsum = np.float32(max(float(w.sum()), 1e-12))
        rows = np.arange(n)
        ce = float(-(w * np.log(np.maximum(p[rows, y], 1e-12))).sum() / wsum)
        diff, cscale = _control_error(ctrl, u, rw)
        mse = float((diff * diff * cscale).sum())
        dlogits = p
        dlogits[rows, y] -= 1.0
        dlogits *= (w / wsum)[:, None]
        dctrl = diff * cscale * np.float32(2.0 * control_weight)
        k = 2 * self.n_hidden
        h = acts[-1]
        grads: list[F32] = [np.empty(0, np.float32)] * len(self.params)
        grads[k], grads[k + 1] = h.T @ dlogits, dlogits.sum(axis=0)
        grads[k + 2], grads[k + 3] = h.T @ dctrl, dctrl.sum(axis=0)
        # float32 at run time; the stubs lose the dtype in these products
        dh = cast(F32, dlogits @ self.params[k].T + dctrl @ self.params[k + 2].T)
        for i in range(self.n_hidden - 1, -1, -1):
            dz = dh * (acts[i + 1] > 0)
            grads[2 * i], grads[2 * i + 1] = acts[i].T @ dz, dz.sum(axis=0)
            if i > 0:
                dh = dz @ self.params[2 * i].T
        return ce + control_weight * mse, grads

    def loss(
        self, x: F32, y: npt.NDArray[np.int64], u: F32, cw: F32, control_weight: float, rw: F32 | None = None
    ) -> float:
        logits, ctrl, _ = self.forward(x)
        w = cw[y] if rw is None else cw[y] * rw
        logp = log_softmax(logits)
        ce = float(-(w * logp[np.arange(len(y)), y]).sum() / max(float(w.sum()), 1e-12))
        diff, cscale = _control_error(ctrl, u, rw)
        return ce + control_weight * float((diff * diff * cscale).sum())

    def to_weights(self) -> MLPWeights:
        """Export form: controls head folded back into physical units."""
        k = 2 * self.n_hidden
        hidden = [(self.params[2 * i].copy(), self.params[2 * i + 1].copy()) for i in range(self.n_hidden)]
        wc = (self.params[k + 2] * CTRL_RANGE[None, :]).astype(np.float32)
        bc = (self.params[k + 3] * CTRL_RANGE + CTRL_CENTRE).astype(np.float32)
        return MLPWeights(hidden=hidden, logits=(self.params[k].copy(), self.params[k + 1].copy()), controls=(wc, bc))


def _control_error(ctrl: F32, u: F32, rw: F32 | None) -> tuple[F32, F32]:
    """(prediction - target, with 0 where the target is unknown) and each element's weight in the
    mean squared error: the row weight over the weighted count of known targets. With every target
    known and no row weights that is the plain mean, 1 / u.size."""
    known = np.isfinite(u)
    diff = np.where(known, ctrl - np.where(known, u, 0.0), 0.0).astype(np.float32)
    scale = known.astype(np.float32)
    if rw is not None:
        scale *= rw[:, None]
    total = float(scale.sum())
    scale /= np.float32(max(total, 1e-12))
    return diff, scale


def _he(rng: np.random.Generator, n_in: int, n_out: int) -> F32:
    return rng.normal(0.0, np.sqrt(2.0 / n_in), (n_in, n_out)).astype(np.float32)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def log_softmax(z: np.ndarray) -> np.ndarray:
    s = z - z.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


def forward_weights(w: MLPWeights, x: F32) -> tuple[F32, F32, F32]:
    """Reference forward pass of exported weights: logits, controls (physical units), decision vector."""
    h = x
    for W, b in w.hidden:
        h = np.maximum(h @ W + b, 0)
    return h @ w.logits[0] + w.logits[1], h @ w.controls[0] + w.controls[1], h


class Adam:
    """AdamW in float32, state allocated once; updates the parameter arrays in place."""

    def __init__(
        self, params: list[F32], lr: float, weight_decay: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
    ) -> None:
        self.params, self.lr, self.wd, self.b1, self.b2, self.eps = params, lr, weight_decay, b1, b2, eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[F32], lr_scale: float = 1.0) -> None:
        self.t += 1
        lr = self.lr * lr_scale
        c1, c2 = 1.0 - self.b1**self.t, 1.0 - self.b2**self.t
        step = np.float32(lr / c1)
        for _i, (p, g, m, v) in enumerate(zip(self.params, grads, self.m, self.v)):
            m *= np.float32(self.b1)
            m += np.float32(1.0 - self.b1) * g
            v *= np.float32(self.b2)
            v += np.float32(1.0 - self.b2) * (g * g)
            if self.wd and p.ndim == 2:  # no decay on biases
                p *= np.float32(1.0 - lr * self.wd)
            p -= step * m / (np.sqrt(v / np.float32(c2)) + np.float32(self.eps))


@dataclass
class FitHistory:
    train_loss: list[float]
    val_loss: list[float]
    best_epoch: int
    epochs_run: int


EpochHook = Callable[[int, float, float], None]


@dataclass(frozen=True)
class FitRows:
    """One split as the fit reads it: inputs, action labels, control targets (NaN: not fitted) and
    per-row weights (None: all 1)."""

    x: F32
    y: npt.NDArray[np.int64]
    controls: F32
    weight: F32 | None = None


def fit(
    train: FitRows, val: FitRows, config: MLPConfig, seed: int, on_epoch: EpochHook | None = None
) -> tuple[MLP, FitHistory]:
    """Minibatch AdamW with a cosine learning rate on `train`; keeps the weights of the best epoch on `val`."""
    x, y, controls, weight = train.x, train.y, train.controls, train.weight
    x_val, y_val, controls_val, weight_val = val.x, val.y, val.controls, val.weight
    rng = np.random.default_rng(seed)
    model = MLP(x.shape[1], config.hidden, schema.N_ACTIONS, len(schema.CONTROLS), rng)
    cw = class_weights(y, config.class_weight_power, weight)
    u, u_val = scale_controls(controls), scale_controls(controls_val)
    opt = Adam(model.params, config.lr, config.weight_decay)
    n, bs = x.shape[0], config.batch_size
    steps_per_epoch = (n + bs - 1) // bs
    total = steps_per_epoch * config.max_epochs
    best, best_params, best_epoch, hist = np.inf, [p.copy() for p in model.params], 0, FitHistory([], [], 0, 0)
    for epoch in range(config.max_epochs):
        order = rng.permutation(n)
        running = 0.0
        for s in range(steps_per_epoch):
            idx = order[s * bs : (s + 1) * bs]
            loss, grads = model.loss_grads(
                x[idx], y[idx], u[idx], cw, config.control_weight, None if weight is None else weight[idx]
            )
            progress = (epoch * steps_per_epoch + s) / total
            opt.step(grads, 0.5 * (1.0 + np.cos(np.pi * progress)))
            running += loss * len(idx)
        val_loss = model.loss(x_val, y_val, u_val, cw, config.control_weight, weight_val)
        hist.train_loss.append(running / n)
        hist.val_loss.append(val_loss)
        hist.epochs_run = epoch + 1
        if on_epoch is not None:
            on_epoch(epoch, running / n, val_loss)
        if val_loss < best:
            best, best_epoch = val_loss, epoch
            best_params = [p.copy() for p in model.params]
        elif epoch - best_epoch >= config.patience:
            break
    for p, b in zip(model.params, best_params):
        p[...] = b
    hist.best_epoch = best_epoch
    return model, hist

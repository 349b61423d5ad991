"""What a model's forward pass costs on this machine, against the tick's budget for models.

Measured when a model is loaded to serve (`serve --model`, `--candidate`, LoadCandidate) at the
server's batch size (max_sessions rows: the tick it may have to run), after its warm-up. The
median decides (a pass or two slowed by a loaded machine must not refuse a model); the slowest
pass is reported beside it. The budget is a share of the tick period
(executor.model_budget_fraction): the live model and a candidate run on the same tick, before its
snapshots leave, and the rest of the period belongs to the gates, the streams and the loop.
"""

from __future__ import annotations

import time

import numpy as np

from dualloop.executor.config import ExecutorConfig
from dualloop.executor.model_runner import DecisionModel, ForwardCost

PASSES = 20
# A model far over budget is not run 20 times at a large batch: its figure is clear after fewer.
MEASURE_FOR_NS = 2_000_000_000
MIN_PASSES = 3


def measure_forward(model: DecisionModel, batch: int, passes: int = PASSES) -> ForwardCost:
    """Runs the model `passes` times on a batch of zeros (fewer if they take over MEASURE_FOR_NS);
    kept as model.forward_cost."""
    x = np.zeros((batch, model.n_inputs), np.float32)
    p = np.zeros((batch, model.n_plan), np.float32)
    times: list[int] = []
    began = time.perf_counter_ns()
    while len(times) < passes:
        t0 = time.perf_counter_ns()
        model.forward(x, p)
        t1 = time.perf_counter_ns()
        times.append(t1 - t0)
        if len(times) >= MIN_PASSES and t1 - began > MEASURE_FOR_NS:
            break
    cost = model.forward_cost = ForwardCost(batch, len(times), int(np.median(times)), max(times))
    return cost


def budget_text(budget_ns: int, fraction: float, period_ns: int) -> str:
    return (
        f"the tick's budget for models, {budget_ns / 1e3:.0f} us ({fraction:g} of the {period_ns / 1e6:g} ms tick: "
        f"executor.model_budget_fraction, 0 turns the check off)"
    )


class OverBudget(ValueError):
    """A model whose forward pass does not fit the tick's budget; the message has the figures."""


def check_live(model: DecisionModel, config: ExecutorConfig) -> ForwardCost | None:
    """The live model's cost at max_sessions rows; OverBudget past the budget (None: no budget)."""
    budget = config.model_budget_ns
    if budget <= 0:
        return None
    cost = measure_forward(model, config.max_sessions)
    if cost.median_ns > budget:
        card = model.card
        raise OverBudget(
            f"model {card.name} {card.version}: its forward pass takes {cost.text()} on this machine, over "
            f"{budget_text(budget, config.model_budget_fraction, config.tick_period_ns)}. Serve it on a longer "
            f"tick (executor.tick_period_ms), with fewer sessions (executor.max_sessions) or a smaller model"
        )
    return cost


def check_candidate(live: DecisionModel, candidate: DecisionModel, config: ExecutorConfig) -> ForwardCost | None:
    """The candidate's cost at max_sessions rows; OverBudget when it and the live model's (as
    measured at start) exceed the budget together: both run on every tick."""
    budget = config.model_budget_ns
    if budget <= 0:
        return None
    batch = config.max_sessions
    cost = measure_forward(candidate, batch)
    live_cost = live.forward_cost
    if live_cost is None or live_cost.batch != batch:
        live_cost = measure_forward(live, batch)
    total = cost.median_ns + live_cost.median_ns
    if total > budget:
        card = candidate.card
        raise OverBudget(
            f"candidate {card.name} {card.version}: its forward pass takes {cost.text()} on this machine; with "
            f"the live model's {live_cost.median_ns / 1e3:.0f} us that is {total / 1e3:.0f} us a tick, over "
            f"{budget_text(budget, config.model_budget_fraction, config.tick_period_ns)}. It would make every "
            f"tick late: try it on a server with a longer tick or fewer sessions"
        )
    return cost

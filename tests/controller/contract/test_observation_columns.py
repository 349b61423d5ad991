"""ObservationColumns: per-agent observations as columns give the server the observations it would
have read from each agent's message, and the messages it records are those the client would have sent."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.columns import ColumnsError
from dualloop.controller.contract.observation_columns import (
    columns_of_arrays,
    observation_columns,
    observation_message,
    observations_from_columns,
)
from dualloop.controller.contract.wire import observation_from_proto
from dualloop.v2 import controller_pb2 as pb


def _messages(rng: np.random.Generator, n: int, features: int | None = None) -> dict[str, pb.Observation]:
    """n agents' messages; `features`: every agent's number of features (None: each its own, 0-8)."""
    out = {}
    for i in range(n):
        size = int(rng.integers(0, 9)) if features is None else features
        obs = pb.Observation(
            seq=int(rng.integers(1, 10**6)),
            timestamp_ns=int(rng.integers(-(10**12), 10**15)),
            features=rng.normal(size=size).astype(np.float32).tolist(),
            sent_time_ns=int(rng.integers(0, 10**15)) if rng.random() < 0.5 else 0,
            release_standstill=bool(rng.random() < 0.2),
        )
        if rng.random() < 0.5:  # a plan, sometimes without values
            obs.plan.plan_id = f"plan-{i}" if rng.random() < 0.8 else ""
            obs.plan.values.extend(rng.normal(size=int(rng.integers(0, 4))).astype(np.float32).tolist())
            obs.plan.valid_for_ns, obs.plan.created_ns = int(rng.integers(0, 10**9)), int(rng.integers(0, 10**12))
        if rng.random() < 0.5:  # the action actually taken
            obs.actual.action_index = int(rng.integers(-1, 5))
            obs.actual.controls.extend(rng.normal(size=int(rng.integers(0, 3))).astype(np.float32).tolist())
        out[f"agent-{i}"] = obs
    return out


def _same(a, b) -> bool:
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("features", [None, 0, 7])  # agents of their own sizes, or all of one (read as one reshape)
def test_columns_read_as_each_message_would_be(seed: int, features: int | None) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 9, 40):
        messages = _messages(rng, n, features)
        wire = observation_columns(messages).SerializeToString()
        read = observations_from_columns(pb.ObservationColumns.FromString(wire), 77, 88)
        assert [sid for sid, _ in read] == list(messages)
        for (_, obs), msg in zip(read, messages.values()):
            assert obs.features.shape == (len(msg.features),)
            assert _same(obs, observation_from_proto(msg, 77, 88))
            assert observation_message(obs).SerializeToString() == msg.SerializeToString()


def test_columns_of_arrays_is_one_tick_of_plain_observations() -> None:
    features = np.arange(12, dtype=np.float32).reshape(3, 4)
    read = observations_from_columns(columns_of_arrays(["a", "b", "c"], 5, 1000, features), 0)
    assert [sid for sid, _ in read] == ["a", "b", "c"]
    for row, (_, obs) in zip(features, read):
        assert obs.seq == 5 and obs.timestamp_ns == 1000 and obs.features.tobytes() == row.tobytes()
        assert obs.plan_values is None and obs.actual_controls is None
    with pytest.raises(ValueError, match=r"features must be \(agents, features\) for 2 agents"):
        columns_of_arrays(["a", "b"], 1, 0, features)


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda c: c.seq.pop(), "ObservationColumns.seq: 2 entries for 3 agents"),
        (lambda c: c.features.pop(), "ObservationColumns.features: 3 counts adding to"),
        (lambda c: c.plan_id.append("x"), "ObservationColumns.plan_id: 2 entries for 1 agents with has_plan"),
        (lambda c: c.actual_controls_count.append(1), "ObservationColumns.actual_controls: 2 counts"),
        # an optional column holds an entry per agent or none
        (lambda c: c.sent_time_ns.pop(), r"ObservationColumns.sent_time_ns: 2 entries for 3 agents \(or none\)"),
        (lambda c: c.has_plan.pop(), r"ObservationColumns.has_plan: 2 entries for 3 agents \(or none\)"),
        # no has_plan column (no agent has a plan) and yet a plan's entries
        (lambda c: c.ClearField("has_plan"), "ObservationColumns.plan_id: 1 entries for 0 agents with has_plan"),
    ],
)
def test_columns_that_do_not_add_up_name_the_column(break_it, message: str) -> None:
    messages = {
        "a": pb.Observation(seq=1, features=[1.0, 2.0], plan=pb.PlanUpdate(plan_id="p", values=[3.0])),
        "b": pb.Observation(seq=1, features=[1.0], actual=pb.ActualAction(action_index=1, controls=[0.5])),
        "c": pb.Observation(seq=1, features=[4.0]),
    }
    cols = observation_columns(messages)
    break_it(cols)
    with pytest.raises(ColumnsError, match=message):
        observations_from_columns(cols, 0)


def test_optional_columns_left_empty_are_every_agents_default() -> None:
    """sent_time_ns, release_standstill, has_plan and has_actual left empty: each agent reads as a
    message that leaves those fields unset would."""
    messages = {f"a{i}": pb.Observation(seq=i + 1, timestamp_ns=5 * i, features=[float(i), 1.0]) for i in range(3)}
    cols = observation_columns(messages)
    for name in ("sent_time_ns", "release_standstill", "has_plan", "has_actual"):
        cols.ClearField(name)
    read = observations_from_columns(pb.ObservationColumns.FromString(cols.SerializeToString()), 7, 8)
    assert [sid for sid, _ in read] == list(messages)
    for (_, obs), msg in zip(read, messages.values()):
        assert _same(obs, observation_from_proto(msg, 7, 8))

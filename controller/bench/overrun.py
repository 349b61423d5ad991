"""`dualloop bench overrun`: a server whose every tick overruns still answers (health, GetStats, a
session's open) and drains on SIGTERM.

The model is built for the run to cost a given time per forward pass on this machine (a chain of
square MatMuls sharing one weight, so the file stays small): measured, then rebuilt with as many
links as that figure asks for. One REALTIME session keeps the tick running the model every period.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dualloop.controller.cards.cards import with_card
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.server_process import ServerProcess
from dualloop.controller.training.driving_card import driving_card
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import TEST_MODEL_PATH
from dualloop.sim import schema
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

WIDTH = 512  # one 1 MiB weight, used by every link of the chain
MIN_STATS_WINDOW_S = 1.0  # the shortest window ticks and missed deadlines are counted over


def build_slow_model(path: Path, links: int, name: str = "dualloop-slow") -> None:
    """The driving schema's test-size card on a graph of `links` WIDTH x WIDTH MatMuls (with tanh)."""
    import onnx  # the train extra: building ONNX files
    from onnx import TensorProto, helper, numpy_helper

    card = driving_card(name, "test", 48, training_metrics={"note": f"slow on purpose: {links} links"})
    io, n_in = card.io, card.input_width + len(card.plan)
    rng = np.random.default_rng(7)

    def weight(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(rows), (rows, cols)).astype(np.float32)

    inits = [
        numpy_helper.from_array(weight(n_in, WIDTH), "W_in"),
        numpy_helper.from_array(weight(WIDTH, WIDTH), "W_link"),
        numpy_helper.from_array(weight(WIDTH, 48), "W_dv"),
        numpy_helper.from_array(weight(48, len(card.actions)), "W_logits"),
        numpy_helper.from_array(weight(48, len(card.controls)), "W_controls"),
    ]
    nodes = [
        helper.make_node("Concat", [io.features, io.plan], ["x0"], axis=1),
        helper.make_node("MatMul", ["x0", "W_in"], ["h0"]),
    ]
    for i in range(links):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "W_link"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"]))
    nodes += [
        helper.make_node("MatMul", [f"h{links}", "W_dv"], ["z_dv"]),
        helper.make_node("Relu", ["z_dv"], [io.decision_vector]),
        helper.make_node("MatMul", [io.decision_vector, "W_logits"], [io.logits]),
        helper.make_node("MatMul", [io.decision_vector, "W_controls"], [io.controls]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        inputs=[
            helper.make_tensor_value_info(io.features, TensorProto.FLOAT, ["batch", card.input_width]),
            helper.make_tensor_value_info(io.plan, TensorProto.FLOAT, ["batch", len(card.plan)]),
        ],
        outputs=[
            helper.make_tensor_value_info(io.logits, TensorProto.FLOAT, ["batch", len(card.actions)]),
            helper.make_tensor_value_info(io.controls, TensorProto.FLOAT, ["batch", len(card.controls)]),
            helper.make_tensor_value_info(io.decision_vector, TensorProto.FLOAT, ["batch", 48]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="dualloop-bench", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    combined, _ = with_card(model, card)
    path.write_bytes(combined.SerializeToString(deterministic=True))


def forward_ms(path: Path, passes: int = 15) -> float:
    """The least CPU time of `passes` forward passes at batch 1, in ms (onnxruntime as the server
    runs it: one thread, the caller's): the model's own work, whatever else the machine runs. Wall
    time is not: a median on a busy machine measured 2-3x the work (a model calibrated on it fit the
    tick once the machine was quiet), and with two busy loops beside it even the fastest of 15 passes
    was inflated, so the rebuilds swung between sizes and ended on a 1.5-2 ms model instead of 15."""
    model = DecisionModel(path, warmup_batches=(1,))
    x, p = np.zeros((1, model.n_inputs), np.float32), np.zeros((1, model.n_plan), np.float32)
    times = []
    for _ in range(passes):
        t0 = time.thread_time_ns()
        model.forward(x, p)
        times.append(time.thread_time_ns() - t0)
    return min(times) / 1e6


def calibrated_slow_model(path: Path, target_ms: float, name: str = "dualloop-slow") -> float:
    """A model costing about target_ms of CPU per forward pass here; returns its least CPU time a
    pass (ms). Rebuilt until within a quarter of the target."""
    links, took = 40, 0.0
    for _ in range(5):
        build_slow_model(path, links, name)
        took = forward_ms(path)
        if abs(took - target_ms) < target_ms / 4:
            break
        links = max(1, round(links * target_ms / took))
    return took


class Feeder:
    """One REALTIME session fed an observation every 50 ms (its declared period), snapshots read as
    they come: with an observation held, every tick runs the model."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.session = DriveSession(channel, "feeder", observation_period_ns=50_000_000)
        self.snapshots = 0
        self.missed_seen = 0  # ticks missed, as its snapshots said
        self.forward_us: list[int] = []  # the server's forward pass on each snapshot's tick
        self.sent_seq = 0
        self.used_seq = 0  # the newest snapshot's observation: the server reads the stream
        self.error: grpc.RpcError | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._read)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        rng = np.random.default_rng(1)
        seq = 0
        while not self._stop.wait(0.05):
            seq += 1
            x = rng.normal(0, 1, len(schema.FEATURES)).astype(np.float32)
            x[0] = 20.0
            self.session.send(seq, time.monotonic_ns(), x.tolist())
            self.sent_seq = seq

    def _read(self) -> None:
        try:
            for snap in self.session.snapshots():
                self.snapshots += 1
                self.missed_seen += snap.ticks_missed_since_previous
                self.forward_us.append(snap.timings.forward_us)
                self.used_seq = snap.observation_seq
        except grpc.RpcError as err:
            self.error = err

    def close(self) -> None:
        self._stop.set()
        self.session.cancel()
        for t in self._threads:
            t.join(10)


def open_once(channel: grpc.Channel, timeout_s: float) -> None:
    """A new REALTIME session's open, answered (then the stream ends: no observations)."""
    request = pb.DriveRequest(open=pb.OpenSession(clock=pb.CLOCK_MODE_REALTIME))
    call = pb_grpc.ControllerServiceStub(channel).Drive(iter([request]), timeout=timeout_s)
    first = next(call)
    assert first.HasField("opened"), first
    call.cancel()


def calls(channel: grpc.Channel, timeout_s: float) -> dict[str, Callable[[], object]]:
    """The calls timed: health, GetStats, a session's open."""
    health = health_pb2_grpc.HealthStub(channel)
    stub = pb_grpc.ControllerServiceStub(channel)
    return {
        "health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s),
        "GetStats": lambda: stub.GetStats(pb.GetStatsRequest(), timeout=timeout_s),
        "open": lambda: open_once(channel, timeout_s),
    }


def time_calls(channel: grpc.Channel, rounds: int, timeout_s: float) -> dict[str, list[float]]:
    """Each call `rounds` times, in turns; seconds each took (timeout_s: one that timed out)."""
    out: dict[str, list[float]] = {}
    fns = calls(channel, timeout_s)
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            try:
                fn()
                took = time.perf_counter() - t0
            except grpc.RpcError:
                took = float("inf")
            out.setdefault(name, []).append(took)
    return out


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    ok = ms[np.isfinite(ms)]
    p50, p99 = np.percentile(ok, [50, 99]) if ok.size else (float("nan"),) * 2
    return {
        "p50_ms": float(p50),
        "p99_ms": float(p99),
        "max_ms": float(ok.max()) if ok.size else float("nan"),
        "unanswered": int(ms.size - ok.size),
    }


def _run(model: Path, work_dir: Path, calls: int, env: dict[str, str]) -> dict[str, object]:
    srv = ServerProcess(["--model", str(model), "--drain-grace", "5", "--log-format", "json"], work_dir, env=env)
    try:
        with grpc.insecure_channel(srv.address) as channel:
            feeder = Feeder(channel)
            time.sleep(1.0)
            stub = pb_grpc.ControllerServiceStub(channel)
            stub.GetStats(pb.GetStatsRequest(reset=True), timeout=30)
            t0 = time.monotonic()
            took = time_calls(channel, calls, timeout_s=10.0)
            # ticks are counted over at least a second: a few calls take milliseconds, in which an
            # overrunning tick of a loaded machine may not have ended at all
            time.sleep(max(0.0, t0 + MIN_STATS_WINDOW_S - time.monotonic()))
            window_s = time.monotonic() - t0
            stats = stub.GetStats(pb.GetStatsRequest(), timeout=30)
            forward_us = feeder.forward_us[-200:]
            code = srv.stop(timeout_s=35, sig=signal.SIGTERM)
            feeder.close()
    finally:
        srv.stop(timeout_s=10)
    return {
        "calls": {name: _summary(v) for name, v in took.items()},
        "server_forward_p50_ms": float(np.median(forward_us)) / 1e3 if forward_us else float("nan"),
        "ticks_per_s": stats.ticks / window_s,
        "missed_per_s": stats.missed_deadlines / window_s,
        "sigterm_exit": code if srv.stopped_in_time else None,
        "sigterm_s": srv.stop_s,
    }


def bench_overrun(out_dir: Path, calls: int = 200, target_ms: float = 15.0) -> dict[str, object]:
    """The test model (ticks on time), then a model of ~target_ms on the 5 ms tick (every tick
    overruns; the budget check is off for it): each call `calls` times, with the machine's load."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slow = out_dir / "slow.onnx"
    forward = calibrated_slow_model(slow, target_ms)
    load_before = os.getloadavg()
    runs = {
        "on time (test model)": _run(TEST_MODEL_PATH, out_dir / "on_time", calls, {}),
        f"every tick overrunning ({forward:.1f} ms model)": _run(
            slow, out_dir / "overrun", calls, {"DUALLOOP_EXECUTOR__MODEL_BUDGET_FRACTION": "0"}
        ),
    }
    result = {
        "slow_forward_ms": forward,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "runs": runs,
    }
    (out_dir / f"overrun-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2))
    return result

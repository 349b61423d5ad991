"""The PM QoS CPU latency request (serve's cpu_wake_latency_us): held while serving, released at
the stop, and a clear refusal (never a crash) where the machine does not allow it."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from dualloop.controller.serve.config import ConfigError, ServerConfig, load_server_config
from dualloop.controller.serve.cpu_latency import (
    DEVICE,
    CpuLatencyRequest,
    current_cpu_wake_latency_us,
    hold_cpu_wake_latency,
)
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

needs_device = pytest.mark.skipif(
    not os.access(DEVICE, os.W_OK) or current_cpu_wake_latency_us() is None,
    reason=f"{DEVICE} is not writable here (it needs root)",
)


@needs_device
def test_a_request_holds_while_open_and_is_gone_once_closed():
    before = current_cpu_wake_latency_us()
    assert before is not None and before > 0, "another process holds a 0 us request: this test cannot tell"
    with CpuLatencyRequest(0) as request:
        assert request.held
        assert current_cpu_wake_latency_us() == 0
    assert not request.held
    assert current_cpu_wake_latency_us() == before


def test_a_missing_device_is_a_refusal_that_names_it(tmp_path: Path):
    missing = tmp_path / "cpu_dma_latency"
    request, said = hold_cpu_wake_latency(0, missing)
    assert request is None
    assert "refused" in said and str(missing) in said and "idle states unchanged" in said


def test_not_asked_for_means_nothing_held_and_nothing_said():
    assert hold_cpu_wake_latency(None) == (None, "")


def test_a_negative_latency_is_refused_by_the_configuration():
    with pytest.raises(ConfigError, match="cpu_wake_latency_us"):
        load_server_config(None, use_env=False, cpu_wake_latency_us=-1)
    with pytest.raises(ValueError, match="0 us or more"):
        CpuLatencyRequest(-5)


@needs_device
def test_a_server_holds_the_request_while_it_serves_and_says_so(test_model_path: Path):
    before = current_cpu_wake_latency_us()
    assert before is not None and before > 0, "another process holds a 0 us request: this test cannot tell"
    with ServerThread(ServerConfig(model=test_model_path, port=0, cpu_wake_latency_us=0)) as srv:
        assert current_cpu_wake_latency_us() == 0
        with grpc.insecure_channel(srv.address) as channel:
            stats = pb_grpc.ControllerServiceStub(channel).GetStats(pb.GetStatsRequest(), timeout=10)
        assert "CPU wake latency <= 0 us" in stats.scheduling
    assert current_cpu_wake_latency_us() == before

"""Keeping idle CPUs quick to wake: a Linux PM QoS CPU latency request (/dev/cpu_dma_latency).

An idle CPU enters an idle state, and leaving it takes time; on a virtual machine the deepest one
halts the vCPU, and waking it again waits for the host to schedule the vCPU. On this project's
2-core VM that wait reached several milliseconds under load: at 32 REALTIME sessions every missed
deadline came from one (`perf sched timehist`: a CPU idle for 3.5 ms while the ticks due on it
waited), and a bare ticker missed its deadlines just as the executor did.

Writing a latency bound to /dev/cpu_dma_latency keeps every CPU out of idle states slower to leave
than that, for as long as the file stays open (the kernel's PM QoS interface, as cyclictest and
tuned's latency-performance profile use it); 0 leaves only polling, so an idle CPU spins instead of
halting. The price is that: idle CPUs burn power (and, on a VM, host CPU time).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

DEVICE = Path("/dev/cpu_dma_latency")


class CpuLatencyRequest:
    """A held request; the kernel drops it when `close()` closes the file (or the process ends)."""

    def __init__(self, latency_us: int, device: Path = DEVICE) -> None:
        """Raises OSError when the device is missing or not writable (it needs root on most systems)."""
        if latency_us < 0:
            raise ValueError(f"CPU wake latency must be 0 us or more, got {latency_us}")
        self.latency_us = latency_us
        self.device = device
        self._fd: int | None = os.open(device, os.O_WRONLY)
        try:
            os.write(self._fd, struct.pack("=i", latency_us))
        except OSError:
            self.close()
            raise

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CpuLatencyRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hold_cpu_wake_latency(latency_us: int | None, device: Path = DEVICE) -> tuple[CpuLatencyRequest | None, str]:
    """The request (None when not asked for or refused) and what happened, for the start line and
    GetStats.scheduling. A refusal is not fatal: the server runs, and says so."""
    if latency_us is None:
        return None, ""
    try:
        request = CpuLatencyRequest(latency_us, device)
    except OSError as err:
        why = f"{device}: {err.strerror or err}"
        return None, f"CPU wake latency {latency_us} us refused ({why}); idle states unchanged"
    return request, f"CPU wake latency <= {latency_us} us"


def current_cpu_wake_latency_us(device: Path = DEVICE) -> int | None:
    """The bound in force now (the smallest of every process's requests; 2,000,000,000 means none),
    or None when the device cannot be read."""
    try:
        with open(device, "rb") as f:
            data = f.read(4)
    except OSError:
        return None
    return int(struct.unpack("=i", data)[0]) if len(data) == 4 else None

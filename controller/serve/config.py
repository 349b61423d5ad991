"""Server configuration: a pydantic model, loadable from TOML or YAML, with errors naming the field."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dualloop.executor.config import ExecutorConfig

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_CLIENT_WINDOW_BYTES = 8192


class ConfigError(ValueError):
    """A configuration a person must fix; the message names the file and the field."""


def _bare(host: str) -> str:
    """The host without the brackets a URL puts around an IPv6 address ("[::1]" -> "::1")."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1, with or without brackets."""
    bare = _bare(host.strip())
    if bare.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """host:port as gRPC parses it: an IPv6 address in brackets ("[::1]:50151"), given with or without."""
    bare = _bare(host.strip())
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


class PlannerConfig(BaseModel):
    """The server's own planner: one plan per session every period, off the executor's path."""

    model_config = ConfigDict(extra="forbid")

    # none: plans come from the clients (Observation.plan), as before.
    source: Literal["none", "behaviour", "onnx", "remote"] = "none"
    path: Path | None = None  # onnx: the planner model file
    address: str | None = None  # remote: host:port of a dualloop.v2.PlannerService service
    period_ms: float = Field(200.0, gt=0.0)
    # Per plan; default: one period. A remote planner's gRPC deadline; other sources' worker is
    # replaced when a plan takes longer (a hang must not keep the next period waiting).
    deadline_ms: float | None = Field(None, gt=0.0)
    # REALTIME planning runs in a child process (its numpy work never holds the server's GIL);
    # "thread" is for sources that cannot be rebuilt in another process.
    worker: Literal["process", "thread"] = "process"
    # The process worker waits and plans under SCHED_IDLE, raised to SCHED_BATCH only while a batch
    # waits for a CPU, where the server may raise it (planner.priority); false: SCHED_BATCH always,
    # a fair (niced) share of a busy machine instead of what nobody else wants.
    idle_priority: bool = True

    @model_validator(mode="after")
    def _source_needs_its_setting(self) -> PlannerConfig:
        if self.source == "onnx" and self.path is None:
            raise ValueError("source 'onnx' needs path (the planner model file)")
        if self.source == "remote" and not self.address:
            raise ValueError("source 'remote' needs address (host:port of a dualloop.v2.PlannerService service)")
        return self

    @property
    def enabled(self) -> bool:
        return self.source != "none"

    @property
    def period_ns(self) -> int:
        return int(round(self.period_ms * 1e6))

    @property
    def deadline_s(self) -> float:
        return (self.deadline_ms if self.deadline_ms is not None else self.period_ms) / 1e3


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Path
    # OOD gate files fitted for this model (`dualloop gate fit`), e.g. one on the decision vector and
    # one on the raw inputs; any of them vetoes. Empty: no gate.
    gates: list[Path] = []
    host: str = "127.0.0.1"
    port: int = Field(50151, ge=0, le=65535)  # 0 picks a free port
    # Binding beyond loopback exposes an actuation-adjacent service: it must be asked for.
    allow_non_loopback: bool = False
    executor: ExecutorConfig = ExecutorConfig()
    # SCHED_FIFO priority for the thread that runs the tick loop (1-99), as ros2_control's controller
    # manager does; None keeps the normal scheduler. Needs CAP_SYS_NICE; refused -> a warning.
    realtime_priority: int | None = Field(None, ge=1, le=99)
    # Record every session to MCAP in this folder (None: no recording). Writing happens on a
    # background thread through a bounded queue; a full queue drops (counted), never blocks a tick.
    record_dir: Path | None = None
    record_rotate_mb: float | None = Field(None, gt=0.0)
    record_rotate_s: float | None = Field(None, gt=0.0)
    # A Drive stream must send its OpenSession within this time.
    open_timeout_s: float = Field(10.0, gt=0.0)
    # The largest request message the server accepts (gRPC's own default, made explicit so that
    # SessionLimits reports what is enforced); a larger one fails the stream with RESOURCE_EXHAUSTED.
    max_receive_message_bytes: int = Field(DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, ge=4096)
    # The HTTP/2 receive window advised to REALTIME clients (SessionLimits): a few snapshots, so a
    # client that pauses reads the newest one, not a backlog buffered in its own window.
    client_window_bytes: int = Field(DEFAULT_CLIENT_WINDOW_BYTES, ge=1024)
    planner: PlannerConfig = PlannerConfig()
    # Prometheus metrics over HTTP (docs/operations.md#metrics): None, the default, serves none and
    # counts nothing; 0 picks a free port (ControllerServer.metrics_port says which).
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # Plain HTTP without authentication: loopback unless allow_non_loopback, as for `host`.
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _metrics_loopback_unless_allowed(self) -> ServerConfig:
        if self.metrics_port is not None and not is_loopback(self.metrics_host) and not self.allow_non_loopback:
            raise ValueError(
                f"metrics_host {self.metrics_host!r} is not a loopback address; set allow_non_loopback "
                f"(--allow-non-loopback) to serve metrics beyond this machine"
            )
        return self

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> ServerConfig:
        if not is_loopback(self.host) and not self.allow_non_loopback:
            raise ValueError(
                f"host {self.host!r} is not a loopback address; set allow_non_loopback "
                f"(--allow-non-loopback) to serve beyond this machine"
            )
        return self


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {field}: {e['msg']}")
    return "\n".join(lines)


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: configuration file not found")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"{path}: unknown configuration format; use .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot parse: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/mapping of settings")
    return data


def load_server_config(path: Path | None = None, **overrides: Any) -> ServerConfig:
    """File settings, then command-line overrides (None means 'not given')."""
    data: dict[str, Any] = read_config_file(path) if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(path) if path else "command line")) from None

"""Server configuration: a pydantic model, loadable from TOML or YAML and DUALLOOP_* environment variables,
with errors naming the field and where it was set."""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, SettingsError

from dualloop.controller.contract.addresses import is_loopback
from dualloop.controller.contract.client import DEFAULT_CLIENT_WINDOW_BYTES
from dualloop.controller.contract.config_files import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    env_name,
    format_validation_error,
    read_config_file,
)
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.serve.security import AuthConfig
from dualloop.executor.config import ExecutorConfig
from dualloop.planner.tls import ClientTLS, ServerTLS

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024


def _not_empty(value: Any) -> Any:
    """An empty path is refused, never read as "." (Path("") is the working folder): an unset ${VAR}
    in a compose or systemd file gives an empty value, and recording into wherever the service
    happens to start, or loading a model from there, is never what its author meant."""
    if value == "":
        raise ValueError(
            "is empty: give a path, or leave the setting out (an empty value, such as an unset variable in "
            "a compose or systemd file, would otherwise mean the working folder)"
        )
    return value


# A path setting: a file or folder the server reads or writes; empty is refused (_not_empty).
SettingPath = Annotated[Path, BeforeValidator(_not_empty)]


class PlannerConfig(BaseModel):
    """The server's own planner: one plan per session every period, off the executor's path."""

    model_config = ConfigDict(extra="forbid")

    # none: plans come from the clients (Observation.plan), as before.
    source: Literal["none", "behaviour", "onnx", "remote"] = "none"
    path: SettingPath | None = None  # onnx: the planner model file
    address: str | None = None  # remote: host:port of a dualloop.v2.PlannerService service
    tls: ClientTLS | None = None  # remote: TLS (mutual with cert_file/key_file) to the planner; None: plaintext
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

    model: SettingPath
    # OOD gate files fitted for this model (`dualloop gate fit`), e.g. one on the decision vector and
    # one on the raw inputs; any of them vetoes. Empty: no gate.
    gates: list[SettingPath] = []
    # A candidate model decided beside the live one on every tick and never applied (its proposals
    # recorded and compared, GetShadowStats); SIGHUP or PromoteCandidate makes it the live model.
    # It must share the live model's feature schema and history; with gates on the live model it
    # needs its own (candidate_gates, fitted on it): the same kinds of check stay on after a swap.
    candidate: SettingPath | None = None
    candidate_gates: list[SettingPath] = []
    host: str = "127.0.0.1"
    port: int = Field(50151, ge=0, le=65535)  # 0 picks a free port
    # Deprecated: no longer permits plaintext beyond loopback (see allow_insecure_non_loopback);
    # a non-loopback host with tls needs only the address. Accepted so that old files still load.
    allow_non_loopback: bool = False
    # Serve plaintext (no TLS) on a non-loopback address: anyone on the network can read and send.
    allow_insecure_non_loopback: bool = False
    tls: ServerTLS | None = None  # None: plaintext, loopback only (unless allow_insecure_non_loopback)
    auth: AuthConfig = AuthConfig()
    executor: ExecutorConfig = ExecutorConfig()
    # SCHED_FIFO priority for the thread that runs the tick loop (1-99), as ros2_control's controller
    # manager does; the server's other threads run one below (realtime_threads.py). None keeps the
    # normal scheduler, and so does 0 (so that a flag or a variable can undo a file's priority).
    # Needs CAP_SYS_NICE; refused -> a warning.
    realtime_priority: int | None = Field(None, ge=0, le=99)
    # Keep idle CPUs out of idle states slower than this to leave, while serving (Linux PM QoS,
    # /dev/cpu_dma_latency; 0: idle CPUs poll instead of halting). On a VM a halted vCPU can wake
    # milliseconds late, a whole deadline; the price is idle CPUs spinning. Needs root; refused ->
    # a warning. None leaves the machine's idle states alone (docs/operations.md#realtime-priority).
    cpu_wake_latency_us: int | None = Field(None, ge=0, le=1_000_000)
    # Record every session to MCAP in this folder (None: no recording; empty is refused, not taken
    # as the working folder). Writing happens on a background thread through a bounded queue; a
    # full queue drops (counted), never blocks a tick.
    record_dir: SettingPath | None = None
    record_rotate_mb: float | None = Field(None, gt=0.0)
    record_rotate_s: float | None = Field(None, gt=0.0)
    # A decoded plot message per snapshot on /dualloop/<session>/plot (docs/foxglove.md), made on
    # the recorder's thread: ~40 us of CPU per snapshot, against ~15 us to record it without (a loaded
    # 2 vCPU VM); at many REALTIME sessions that thread competes with the tick loop for the GIL. false:
    # the data topics only.
    record_plots: bool = True
    # A Drive stream must send its OpenSession (a DriveAgents stream its first request) within this time.
    open_timeout_s: float = Field(10.0, gt=0.0)
    # A connection silent this long is pinged (HTTP/2 keepalive), and closed when the ping is not
    # answered within keepalive_timeout_s: a client whose host vanished without closing its
    # connection (power, a cable, a partition) ends its sessions then, rather than holding their
    # slots for the two hours of gRPC's default.
    keepalive_s: float = Field(30.0, gt=0.0)
    keepalive_timeout_s: float = Field(10.0, gt=0.0)
    # The largest request message the server accepts (gRPC's own default, made explicit so that
    # SessionLimits reports what is enforced); a larger one fails the stream with RESOURCE_EXHAUSTED.
    max_receive_message_bytes: int = Field(DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, ge=4096)
    # The HTTP/2 receive window advised to REALTIME clients (SessionLimits): a few snapshots, so a
    # client that pauses reads the newest one, not a backlog buffered in its own window.
    client_window_bytes: int = Field(DEFAULT_CLIENT_WINDOW_BYTES, ge=1024)
    # The most agents one DriveAgents stream holds at once (SessionLimits.max_agents_per_stream); each
    # agent is a session and counts towards executor.max_sessions too.
    max_agents_per_stream: int = Field(1024, ge=1, le=4096)
    planner: PlannerConfig = PlannerConfig()
    # Operations (docs/operations.md). On SIGTERM/SIGINT open streams get this long to end after
    # their final snapshot before gRPC cancels what is left.
    drain_grace_s: float = Field(5.0, ge=0.0)
    # Server reflection (grpcurl, Postman); None: on iff the server binds loopback.
    reflection: bool | None = None
    log_format: Literal["human", "json"] = "human"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def reflection_enabled(self) -> bool:
        return is_loopback(self.host) if self.reflection is None else self.reflection

    # Prometheus metrics over HTTP (docs/operations.md#metrics): None, the default, serves none and
    # counts nothing; 0 picks a free port (ServerLifecycle.metrics_port says which).
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # Plain HTTP without authentication: loopback unless allow_insecure_non_loopback (the flag that
    # also allows a plaintext gRPC server beyond loopback).
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _metrics_loopback_unless_allowed(self) -> ServerConfig:
        if (
            self.metrics_port is not None
            and not is_loopback(self.metrics_host)
            and not self.allow_insecure_non_loopback
        ):
            raise ValueError(
                f"metrics_host {self.metrics_host!r} is not a loopback address and the metrics are plain "
                f"HTTP without authentication; set allow_insecure_non_loopback "
                f"(--insecure-plaintext-on-network) to serve them beyond this machine"
            )
        return self

    @model_validator(mode="after")
    def _nothing_ignored(self) -> ServerConfig:
        """Settings that would do nothing, or something twice, are mistakes to report, not to serve."""
        if self.candidate_gates and self.candidate is None:
            raise ValueError(
                "candidate_gates (--candidate-gate) are given without candidate (--candidate): they gate a "
                "candidate model; add the candidate, or give the gates as gates (--gate) for the live model"
            )
        for name, paths in (("gates", self.gates), ("candidate_gates", self.candidate_gates)):
            twice = sorted({str(p) for p in paths if paths.count(p) > 1})
            if twice:
                raise ValueError(f"{name} names {', '.join(twice)} more than once: each gate file once")
        if self.record_dir is not None and self.record_dir.exists() and not self.record_dir.is_dir():
            raise ValueError(f"record_dir (--record-dir) {self.record_dir} is a file, not a folder")
        if self.record_dir is None and (self.record_rotate_mb is not None or self.record_rotate_s is not None):
            raise ValueError(
                "record_rotate_mb and record_rotate_s rotate a recording: they need record_dir (--record-dir)"
            )
        # against the default, not "given": a whole configuration written out and read back (a worker's)
        # names every field
        if self.metrics_port is None and self.metrics_host != ServerConfig.model_fields["metrics_host"].default:
            raise ValueError(
                "metrics_host (--metrics-host) is given without metrics_port (--metrics-port): nothing serves"
            )
        return self

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> ServerConfig:
        if not is_loopback(self.host) and self.tls is None and not self.allow_insecure_non_loopback:
            raise ValueError(
                f"host {self.host!r} is not a loopback address and TLS is not configured: set tls.cert_file "
                f"and tls.key_file (--tls-cert, --tls-key) to serve beyond this machine, or, to send "
                f"everything in plaintext to the network, allow_insecure_non_loopback "
                f"(--insecure-plaintext-on-network)"
                + ("; allow_non_loopback no longer permits plaintext" if self.allow_non_loopback else "")
            )
        if (
            self.auth.client_identities or self.auth.shadow_client_identities or self.auth.admin_client_identities
        ) and (self.tls is None or not self.tls.mutual):
            raise ValueError(
                "auth.client_identities need mutual TLS: set tls.client_ca_file (--tls-client-ca) to verify "
                "client certificates"
            )
        return self


class _ServerEnv(BaseSettings, ServerConfig):
    """Only to read DUALLOOP_* variables for ServerConfig's fields (validation is ServerConfig's)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, case_sensitive=False, extra="forbid"
    )


def read_env() -> dict[str, Any]:
    """The DUALLOOP_* variables that name a ServerConfig field, nested by "__", values still strings
    (lists and tables are JSON). Variables that name no field are not read (DUALLOOP_CONFIG is the file's)."""
    try:
        return dict(EnvSettingsSource(_ServerEnv)())
    except SettingsError as err:
        field = re.search(r'field "(\w+)"', str(err))
        name = env_name((field.group(1),)) if field else ENV_PREFIX + "*"
        raise ConfigError(
            f"environment: {name} cannot be parsed ({err}); lists and tables are given as JSON, "
            f"e.g. {ENV_PREFIX}GATES='[\"a.gate.npz\"]'"
        ) from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """over's settings on top of base's, table by table (one env variable changes one nested field)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _kinds(annotation: Any) -> set[Any]:
    """The classes an annotation names, through Optional, unions and lists."""
    args = typing.get_args(annotation)
    return set().union(*map(_kinds, args)) if args else {annotation}


def _from_folder(data: dict[str, Any], model: type[BaseModel], folder: Path) -> dict[str, Any]:
    """`data` (a config file's table for `model`) with every relative path taken from `folder`, the
    file's own: a file names its neighbours, wherever the server is started from (as Prometheus and
    Compose read theirs). Nested tables too (tls, auth, planner)."""
    out = dict(data)
    for name, field in model.model_fields.items():
        value, kinds = out.get(name), _kinds(field.annotation)
        tables = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if isinstance(value, dict) and tables:
            out[name] = _from_folder(value, tables[0], folder)
        elif Path in kinds and value is not None:

            def place(v: Any) -> Any:
                return str(folder / v) if isinstance(v, str) and v and not Path(v).is_absolute() else v

            out[name] = [place(v) for v in value] if isinstance(value, list) else place(value)
    return out


def _is_non_finite(value: Any) -> bool:
    """nan or an infinity, given as a float (YAML, TOML, a flag) or as text (a variable)."""
    try:
        return isinstance(value, (float, str)) and not math.isfinite(float(value))
    except ValueError:
        return False


def _non_finite(
    data: dict[str, Any], model: type[BaseModel], loc: tuple[str | int, ...] = ()
) -> list[InitErrorDetails]:
    """A finite_number error for every float setting in `data` (a table for `model`, nested tables too)
    that is nan or infinite, which pydantic takes for a float: nan fails a bound with a misleading "less
    than or equal to 1000", and inf passes them all (a keepalive or a deceleration limit of forever).
    pydantic's own refusal, allow_inf_nan=False, is a model's own setting and stops at a nested model
    (docs.pydantic.dev, "Configuration propagation"): the executor's and its safety limits' models, not
    this module's, would each need it. One walk here covers every float of the configuration."""
    errors: list[InitErrorDetails] = []
    for name, field in model.model_fields.items():
        value, kinds = data.get(name), _kinds(field.annotation)
        tables = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if isinstance(value, dict) and tables:
            errors += _non_finite(value, tables[0], (*loc, name))
        elif float in kinds:
            items = enumerate(value) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                if _is_non_finite(item):
                    at = (*loc, name) if i is None else (*loc, name, i)
                    errors.append({"type": "finite_number", "loc": at, "input": item})
    return errors


def load_server_config(path: Path | None = None, *, use_env: bool = True, **overrides: Any) -> ServerConfig:
    """Defaults < config file < DUALLOOP_* environment variables < command-line overrides (None means
    'not given'): the conventional order, so a container's env adjusts a shipped file and a flag wins.
    Relative paths in the file are taken from its folder; in variables and flags, from the working one."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _from_folder(read_config_file(path), ServerConfig, path.resolve().parent)
    env = read_env() if use_env else {}
    flags = {k: v for k, v in overrides.items() if v is not None}
    data = _merge(_merge(data, env), flags)
    sources = [str(path)] if path else []
    sources += ["environment"] if env else []
    sources += ["command line"] if flags or not sources else []
    non_finite = _non_finite(data, ServerConfig)
    try:
        if non_finite:  # said for themselves, before the bounds' messages
            raise ValidationError.from_exception_data(ServerConfig.__name__, non_finite)
        return ServerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, ", ".join(sources), env, flags)) from None


def gates_summary(config: ServerConfig) -> str:
    """For the start line: the gates the live model is served with. An ungated server says so loudly:
    `replay` and `stream` gate the shipped model by default, and a user may expect `serve` to."""
    if not config.gates:
        return "no OOD gate [WARNING: --gate adds one]"
    return f"gate{'s' if len(config.gates) > 1 else ''} {', '.join(g.name for g in config.gates)}"

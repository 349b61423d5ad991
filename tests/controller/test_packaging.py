"""The lean install: serving imports none of the extras, and works with them absent (blocked here, as a
`pip install dualloop` without extras has them absent); `python -m dualloop`, `--version`; the Dockerfile."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tomllib
from concurrent import futures
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.models import DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from tests.blocked_imports import blocking

REPO = Path(__file__).resolve().parents[2]
# what the extras bring: serving must import none of them (rich: used when present, so only blocked below)
HEAVY = (
    "matplotlib",
    "scipy",
    "sklearn",
    "ray",
    "gymnasium",
    "highway_env",
    "torch",
    "onnx",
    "mcap_ros2",
    "carla_driver_interface",
)
EXTRAS = (*HEAVY, "rich")

# Runs `dualloop` as `python -m dualloop` does, with every extra made unimportable first.
LEAN_RUNNER = blocking(EXTRAS, "blocked: lean install") + (
    "import runpy\n"
    'sys.argv = ["dualloop", *sys.argv[1:]]\n'
    'runpy.run_module("dualloop", run_name="__main__", alter_sys=True)\n'
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}


def _lean(tmp_path: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    runner = tmp_path / "lean_dualloop.py"
    runner.write_text(LEAN_RUNNER)
    return subprocess.run(
        [sys.executable, str(runner), *args], capture_output=True, text=True, timeout=120, env=_env(), **kw
    )


def test_serving_modules_import_no_extra():
    code = (
        "import sys; import dualloop.controller.serve.cli, dualloop.controller.serve.lifecycle, "
        "dualloop.controller.contract.client, dualloop.controller.logs.recorder; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_version_and_help_without_extras(tmp_path):
    proc = _lean(tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"dualloop {version('dualloop')} (wire contract dualloop.v2; shipped model ")
    proc = _lean(tmp_path, "serve", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--model" in proc.stdout and "DUALLOOP_CONFIG" in proc.stdout


def test_extra_command_names_the_extra_to_install(tmp_path):
    proc = _lean(tmp_path, "demo", "--scenarios", "cut_in")
    assert proc.returncode == 2
    assert "`dualloop demo` needs rich" in proc.stderr and "pip install 'dualloop[demo]'" in proc.stderr
    proc = _lean(tmp_path, "make-test-model")
    assert proc.returncode == 2 and "pip install 'dualloop[train]'" in proc.stderr
    bag, mapping = tmp_path / "b.mcap", tmp_path / "m.yaml"
    bag.write_bytes(b"")
    mapping.write_text("rate_hz: 10\nfeatures:\n  ego_speed: {topic: /odom, field: twist.twist.linear.x}\n")
    proc = _lean(tmp_path, "import", "rosbag2", str(bag), "--map", str(mapping))
    assert proc.returncode == 2, proc.stderr
    assert (
        "`dualloop import rosbag2` needs mcap_ros2" in proc.stderr and "pip install 'dualloop[rosbag2]'" in proc.stderr
    )
    proc = _lean(tmp_path, "card", "init", "my.onnx")  # reading and writing ONNX graphs needs onnx
    assert proc.returncode == 2 and "pip install 'dualloop[train]'" in proc.stderr
    proc = _lean(tmp_path, "highway", "--seeds", "1")
    assert proc.returncode == 2 and "pip install 'dualloop[highway]'" in proc.stderr
    proc = _lean(tmp_path, "alpasim", "--port", "0")
    assert proc.returncode == 2 and "pip install 'dualloop[alpasim]'" in proc.stderr


@pytest.mark.slow
def test_serve_and_a_session_without_extras(tmp_path, test_model_path):
    runner = tmp_path / "lean_dualloop.py"
    runner.write_text(LEAN_RUNNER)
    cmd = [sys.executable, str(runner), "serve", "--model", str(test_model_path), "--port", "0"]
    cmd += ["--record-dir", str(tmp_path / "rec")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r" on 127\.0\.0\.1:(\d+)", line)
        assert match, line + proc.stdout.read()
        with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            session = DriveSession(channel, "lean", pb.CLOCK_MODE_LOCKSTEP)
            for k in range(3):
                session.send(k + 1, k * 5_000_000, [0.0] * 19)
                snap = session.recv()
                assert snap.observation_seq == k + 1
            session.close()
            assert list(session.snapshots()) == []
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "stopped after" in rest and "blocked" not in rest
        assert list((tmp_path / "rec").glob("*.mcap"))  # recording works in the lean install too
    finally:
        if proc.poll() is None:
            proc.kill()


def test_python_dash_m_dualloop_is_the_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "dualloop", "--help"], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert proc.returncode == 0 and "usage: dualloop" in proc.stdout and "serve" in proc.stdout


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(s for s in text.splitlines() if not s.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_structure():
    # No Docker engine here (docs/operations.md#container): check what matters in the text.
    steps = _instructions((REPO / "Dockerfile").read_text())
    kinds = [k for k, _ in steps]
    froms = [arg for k, arg in steps if k == "FROM"]
    assert all(re.match(r"python:3\.11(\.\d+)?-slim\b", f) for f in froms), froms
    final = len(kinds) - 1 - kinds[::-1].index("FROM")  # the runtime stage
    runtime = steps[final:]
    users = [arg for k, arg in runtime if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the server must not run as root"
    assert [k for k, _ in runtime].index("USER") < [k for k, _ in runtime].index("ENTRYPOINT")
    installs = re.findall(r"pip install ((?:--\S+ )*)(\S+)", " ".join(arg for k, arg in steps if k == "RUN"))
    assert installs and all("[" not in target for _, target in installs), installs  # the serve install only
    health = [arg for k, arg in runtime if k == "HEALTHCHECK"]
    assert len(health) == 1 and "CMD" in health[0] and "healthcheck.py" in health[0]
    assert any(k == "COPY" and "docker/healthcheck.py" in arg for k, arg in runtime)
    expose = [arg for k, arg in runtime if k == "EXPOSE"]
    env = " ".join(arg for k, arg in runtime if k == "ENV")
    assert "DUALLOOP_HOST" not in env  # loopback unless the user opts in (with TLS or the insecure flag)
    entry = " ".join(arg for k, arg in runtime if k in ("ENTRYPOINT", "CMD"))
    assert "dualloop" in entry and "serve" in entry
    # The image's settings are a file, never DUALLOOP_* variables: a variable outranks a file, so the
    # image's model, gates and port overrode the user's mounted configuration (found by QA)
    assert re.search(r"DUALLOOP_CONFIG=/opt/dualloop/server\.toml\b", env), env
    assert not re.search(r"DUALLOOP_(MODEL|GATES|PORT)=", env), env
    assert any(k == "COPY" and arg.split() == ["docker/server.toml", "/opt/dualloop/server.toml"] for k, arg in runtime)
    image = tomllib.loads((REPO / "docker" / "server.toml").read_text())
    assert expose == [str(image["port"])] == ["50151"]
    assert image["model"].endswith("/site-packages/dualloop/models/base.onnx")
    assert [Path(g).name for g in image["gates"]] == [g.name for g in DEFAULT_GATES]
    site = "/opt/dualloop/lib/python3.11/site-packages/dualloop/"
    assert all(p.startswith(site) for p in [image["model"], *image["gates"]])
    assert any(k == "RUN" and "install -d -o 10001 -g 10001 /records" in arg for k, arg in runtime)


def _probe_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", REPO / "docker" / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_health_probe_against_a_real_grpc_health_endpoint(monkeypatch):
    # A loopback gRPC server answering grpc.health.v1.Health/Check as the server's health service does
    # (status per service); the probe must exit 0 only for SERVING, 1 for NOT_SERVING and UNIMPLEMENTED.
    probe = _probe_module()
    status = {"": 1, "dualloop.v2.ControllerService": 2}
    asked: list[bytes] = []

    def check(request: bytes, context: grpc.ServicerContext) -> bytes:
        asked.append(request)
        service = request[2:].decode() if request else ""
        return bytes([0x08, status[service]])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("DUALLOOP_PROBE_PORT", str(port))  # whatever servers run on this machine
        assert probe.main() == 0 and asked[-1] == b""
        monkeypatch.setenv("DUALLOOP_PROBE_SERVICE", "dualloop.v2.ControllerService")
        assert probe.main() == 1 and asked[-1] == b"\x0a\x1ddualloop.v2.ControllerService"
        status["dualloop.v2.ControllerService"] = 1
        assert probe.main() == 0
    finally:
        server.stop(None)
    # nothing answering: unhealthy, not a traceback
    assert probe.main() == 1


def _fake_proc(root: Path, processes: dict[int, list[str]]) -> Path:
    for pid, argv in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    return root


def test_the_probe_asks_the_port_the_server_was_given(tmp_path: Path) -> None:
    """Found by QA: `docker run dualloop serve --port 6000` served, and the probe asked 50151 forever
    (unhealthy). The server's order: its flag, then DUALLOOP_PORT, then its configuration file."""
    probe = _probe_module()
    conf = tmp_path / "server.toml"
    conf.write_text("port = 6100\n")
    serve = ["/opt/dualloop/bin/python", "/opt/dualloop/bin/dualloop", "serve"]
    proc = _fake_proc(tmp_path / "proc", {1: ["tini", "--", *serve, "--port", "6000"], 7: [*serve, "--port=6001"]})
    argv, _ = probe.server_process(proc)
    assert probe.server_port({}, argv) == "6000"  # the lowest pid running `dualloop serve`
    assert probe.server_port({"DUALLOOP_PORT": "7000"}, argv) == "6000"  # a flag outranks a variable
    assert probe.server_port({"DUALLOOP_PROBE_PORT": "9"}, argv) == "9"  # the probe's own setting first
    assert probe.server_port({"DUALLOOP_PORT": "7000", "DUALLOOP_CONFIG": str(conf)}, serve) == "7000"
    assert probe.server_port({"DUALLOOP_CONFIG": str(conf)}, serve) == "6100"
    assert probe.server_port({}, [*serve, "--config", "server.toml"], tmp_path) == "6100"  # the server's folder
    assert probe.server_port({}, serve) == "50151"
    assert probe.server_process(_fake_proc(tmp_path / "none", {1: ["sleep", "9"]})) == ([], Path("/"))

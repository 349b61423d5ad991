"""TLS, mutual TLS and authentication of the real server on loopback, with certificates made here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.serve.config import ConfigError, ServerConfig, load_server_config
from dualloop.controller.serve.lifecycle import ServerLifecycle, ServerThread
from dualloop.controller.serve.planning import source_factory
from dualloop.controller.serve.security import AuthConfig, Authenticator, AuthError, Scope
from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.plan import PlanRequest
from dualloop.planner.remote import RemotePlanner, RemotePlannerError, serve_planner
from dualloop.planner.tls import ClientTLS, ServerTLS
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.tls_certs import Issued, TestCA
from tests.planner.test_remote import features

TOKEN_A = "tok-a-0123456789abcdef"
TOKEN_B = "tok-b-fedcba9876543210"  # the rotated-in second token
SHADOW_TOKEN = "tok-shadow-00112233445566"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = TestCA(folder, "ca"), TestCA(folder, "other")
    return {
        "ca": ca,
        "other": other,
        "server": ca.server_cert(),
        "robot1": ca.client_cert("robot1"),
        "robot2": ca.client_cert("robot2"),
        "intruder": other.client_cert("robot1"),  # the allowed name, signed by the wrong CA
        "other_server": other.server_cert(),
    }


def tls(pki: dict, client_ca: bool = False) -> ServerTLS:
    server: Issued = pki["server"]  # type: ignore[assignment]
    ca: TestCA = pki["ca"]  # type: ignore[assignment]
    return ServerTLS(
        cert_file=server.cert_file, key_file=server.key_file, client_ca_file=ca.cert_file if client_ca else None
    )


def creds(ca: TestCA, client: Issued | None = None, token: str | None = None) -> grpc.ChannelCredentials:
    c = grpc.ssl_channel_credentials(
        ca.cert_file.read_bytes(), client.key_pem if client else None, client.cert_pem if client else None
    )
    # access_token_call_credentials sends 'authorization: Bearer <token>' on every call
    return grpc.composite_channel_credentials(c, grpc.access_token_call_credentials(token)) if token else c


@pytest.fixture()
def start(test_model_path: Path) -> Iterator:
    servers: list[ServerThread] = []

    def run(**settings: object) -> ServerThread:
        srv = ServerThread(ServerConfig(model=test_model_path, port=0, **settings)).start()  # type: ignore[arg-type]
        servers.append(srv)
        return srv

    yield run
    for srv in servers:
        srv.stop()


def model_info(channel: grpc.Channel, metadata: tuple = ()) -> pb.ModelInfo:
    return (
        pb_grpc.ControllerServiceStub(channel)
        .GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=metadata)
        .model
    )


def rpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kwargs)
    return err.value


def lockstep_snapshot(channel: grpc.Channel, shadow: bool = False) -> pb.DecisionSnapshot:
    session = DriveSession(channel, "", pb.CLOCK_MODE_LOCKSTEP, shadow=shadow)
    session.send(1, 1_000_000_000, [20.0] + [0.0] * 18)
    snap = session.recv()
    session.close()
    return snap


# --- TLS and mutual TLS -------------------------------------------------------------------------


def test_tls_handshake_and_a_session(start, pki):
    srv = start(tls=tls(pki))
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        assert len(model_info(channel).features) == 19
        snap = lockstep_snapshot(channel)
        assert snap.tick == 0 and len(snap.applied.controls) > 0


def test_plaintext_client_against_tls_server_refused(start, pki):
    srv = start(tls=tls(pki))
    with grpc.insecure_channel(srv.address) as channel:
        err = rpc_error(model_info, channel)
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_server_cert_from_wrong_ca_refused_by_client(start, pki):
    srv = start(tls=tls(pki))
    with grpc.secure_channel(srv.address, creds(pki["other"])) as channel:
        err = rpc_error(model_info, channel)
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_mutual_tls(start, pki):
    srv = start(tls=tls(pki, client_ca=True))
    with grpc.secure_channel(srv.address, creds(pki["ca"], pki["robot1"])) as channel:
        assert len(model_info(channel).features) == 19
        assert lockstep_snapshot(channel).tick == 0
    for client in (None, pki["intruder"]):  # no client certificate; one from the wrong CA
        with grpc.secure_channel(srv.address, creds(pki["ca"], client)) as channel:
            err = rpc_error(model_info, channel)
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), client


def test_client_certificate_identity_allow_list(start, pki):
    srv = start(
        tls=tls(pki, client_ca=True),
        auth=AuthConfig(client_identities=["robot1"], shadow_client_identities=["robot2"], tokens_env=None),
    )
    with grpc.secure_channel(srv.address, creds(pki["ca"], pki["robot1"])) as channel:
        assert lockstep_snapshot(channel).tick == 0
    with grpc.secure_channel(srv.address, creds(pki["ca"], pki["robot2"])) as channel:
        err = rpc_error(lockstep_snapshot, channel)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert lockstep_snapshot(channel, shadow=True).tick == 0
    third = pki["ca"].client_cert("robot3")  # a valid certificate, a name not on the list
    with grpc.secure_channel(srv.address, creds(pki["ca"], third)) as channel:
        err = rpc_error(model_info, channel)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "client certificate whose identity is allowed" in err.details()


def test_server_certificate_reloaded_without_restart(start, pki, tmp_path):
    first = pki["server"]
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    srv = start(tls=ServerTLS(cert_file=cert, key_file=key))
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        model_info(channel)
    renewed = pki["other_server"]  # from another CA: only a reloaded server can satisfy this client
    key.write_bytes(renewed.key_pem)
    cert.write_bytes(renewed.cert_pem)
    with grpc.secure_channel(srv.address, creds(pki["other"])) as channel:
        assert len(model_info(channel).features) == 19
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:  # the old CA no longer matches
        rpc_error(model_info, channel)


# --- tokens --------------------------------------------------------------------------------------


@pytest.fixture()
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(
        f"# rotation: A is being retired, B replaces it\n{TOKEN_A}\n{TOKEN_B}  # since today\n\nshadow:{SHADOW_TOKEN}\n"
    )
    return path


def test_token_missing_wrong_right(start, pki, tokens_file):
    srv = start(tls=tls(pki), auth=AuthConfig(tokens_file=tokens_file, tokens_env=None))
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        missing = rpc_error(model_info, channel)
        wrong = rpc_error(model_info, channel, (("authorization", f"Bearer {TOKEN_A}x"),))
        not_bearer = rpc_error(model_info, channel, (("authorization", TOKEN_A),))
        for err in (missing, wrong, not_bearer):
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        # the same message whichever way it was wrong: no hint for a guesser
        assert missing.details() == wrong.details() == not_bearer.details()
        assert "authorization: Bearer <token>" in missing.details()
        assert len(model_info(channel, (("authorization", f"Bearer {TOKEN_A}"),)).features) == 19
        # a stream is checked too, and the generic v1 service
        assert rpc_error(lockstep_snapshot, channel).code() == grpc.StatusCode.UNAUTHENTICATED
        v1 = channel.unary_unary("/dualloop.v1.Controller/GetModelInfo")
        assert rpc_error(v1, b"", timeout=10).code() == grpc.StatusCode.UNAUTHENTICATED
    for token in (TOKEN_A, TOKEN_B):  # both tokens of a rotation work, on streams too
        with grpc.secure_channel(srv.address, creds(pki["ca"], token=token)) as channel:
            assert lockstep_snapshot(channel).tick == 0


def test_tokens_file_rotation_without_restart(start, pki, tokens_file, monkeypatch):
    monkeypatch.setattr("dualloop.controller.serve.security._RELOAD_CHECK_S", 0.0)
    srv = start(tls=tls(pki), auth=AuthConfig(tokens_file=tokens_file, tokens_env=None))
    new = tokens_file.with_name("tokens.new")
    new.write_text(f"{TOKEN_B}\n")
    new.replace(tokens_file)  # the atomic rename the docs ask for
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        assert model_info(channel, (("authorization", f"Bearer {TOKEN_B}"),)).features
        err = rpc_error(model_info, channel, (("authorization", f"Bearer {TOKEN_A}"),))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED


def test_shadow_only_token(start, pki, tokens_file):
    srv = start(tls=tls(pki), auth=AuthConfig(tokens_file=tokens_file, tokens_env=None))
    with grpc.secure_channel(srv.address, creds(pki["ca"], token=SHADOW_TOKEN)) as channel:
        err = rpc_error(lockstep_snapshot, channel, shadow=False)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "shadow-only" in err.details() and "OpenSession.shadow = true" in err.details()
        assert lockstep_snapshot(channel, shadow=True).tick == 0
        # the refused actuating session never opened: only the shadow one counts
        assert srv.call(lambda: srv.server.runtime.stats.sessions_opened) == 1


def test_tokens_from_environment(start, pki, monkeypatch):
    monkeypatch.setenv("DUALLOOP_TOKENS", f"{TOKEN_A}, shadow:{SHADOW_TOKEN}")
    srv = start(tls=tls(pki))
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        assert rpc_error(model_info, channel).code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.secure_channel(srv.address, creds(pki["ca"], token=TOKEN_A)) as channel:
        assert lockstep_snapshot(channel).tick == 0
    with grpc.secure_channel(srv.address, creds(pki["ca"], token=SHADOW_TOKEN)) as channel:
        assert rpc_error(lockstep_snapshot, channel).code() == grpc.StatusCode.PERMISSION_DENIED


def test_exempt_methods_need_no_token(start, pki, tokens_file):
    """Health checks answer without credentials by default (probes carry no token); a configured
    exemption covers other methods; everything else still needs a token."""
    srv = start(
        tls=tls(pki),
        auth=AuthConfig(
            tokens_file=tokens_file,
            tokens_env=None,
            exempt_methods=[*AuthConfig().exempt_methods, "/dualloop.v2.ControllerService/GetModelInfo"],
        ),
    )
    with grpc.secure_channel(srv.address, creds(pki["ca"])) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert model_info(channel).features
        stats = pb_grpc.ControllerServiceStub(channel).GetStats
        assert rpc_error(stats, pb.GetStatsRequest(), timeout=10).code() == grpc.StatusCode.UNAUTHENTICATED


def test_token_scope_compares_every_token():
    auth = Authenticator(AuthConfig(tokens_env="T"), {"T": f"{TOKEN_A},shadow:{SHADOW_TOKEN}"})
    assert auth.scope((("authorization", f"Bearer {TOKEN_A}"),), {}) is Scope.FULL
    assert auth.scope((("authorization", f"bearer {SHADOW_TOKEN}"),), {}) is Scope.SHADOW
    assert auth.scope((("authorization", f"Bearer {TOKEN_A[:-1]}"),), {}) is None
    assert auth.scope((), {}) is None
    off = Authenticator(AuthConfig(tokens_env="T"), {})
    assert not off.enabled


def test_admin_scope_from_token_and_certificate():
    admin = "admin-token-0123456789abcdef"
    auth = Authenticator(AuthConfig(tokens_env="T"), {"T": f"{TOKEN_A},admin:{admin}"})
    assert auth.scope((("authorization", f"Bearer {admin}"),), {}) is Scope.ADMIN
    assert auth.scope((("authorization", f"Bearer {TOKEN_A}"),), {}) is Scope.FULL
    both = Authenticator(
        AuthConfig(tokens_env="T", client_identities=["robot"], admin_client_identities=["ops"]),
        {"T": f"{TOKEN_A},admin:{admin}"},
    )
    # with tokens and certificates both, the narrower scope wins: admin needs both to be admin
    ops, robot = {"x509_common_name": [b"ops"]}, {"x509_common_name": [b"robot"]}
    assert both.scope((("authorization", f"Bearer {admin}"),), ops) is Scope.ADMIN
    assert both.scope((("authorization", f"Bearer {admin}"),), robot) is Scope.FULL
    assert both.scope((("authorization", f"Bearer {TOKEN_A}"),), ops) is Scope.FULL
    assert both.scope((("authorization", f"Bearer {admin}"),), {}) is None


def test_bad_tokens_name_the_line(tmp_path, test_model_path):
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN_A}\nshort\n")
    with pytest.raises(AuthError, match=rf"tokens file {re.escape(str(path))}, line 2: token shorter than 16"):
        Authenticator(AuthConfig(tokens_file=path, tokens_env=None))
    path.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="no token in it"):  # at server start, as a ConfigError
        ServerLifecycle(ServerConfig(model=test_model_path, auth=AuthConfig(tokens_file=path)))
    with pytest.raises(ConfigError, match="cannot read"):
        ServerLifecycle(ServerConfig(model=test_model_path, auth=AuthConfig(tokens_file=tmp_path / "missing")))


# --- configuration -------------------------------------------------------------------------------


def test_non_loopback_without_tls_refused_naming_the_flag(test_model_path, pki):
    with pytest.raises(ConfigError, match="--insecure-plaintext-on-network"):
        load_server_config(model=test_model_path, host="192.0.2.10")
    with pytest.raises(ConfigError, match="allow_non_loopback no longer permits plaintext"):
        load_server_config(model=test_model_path, host="192.0.2.10", allow_non_loopback=True)
    # validated, never bound: TLS needs only the address; plaintext needs the loud flag
    server: Issued = pki["server"]
    with_tls = load_server_config(
        model=test_model_path, host="192.0.2.10", tls={"cert_file": server.cert_file, "key_file": server.key_file}
    )
    assert with_tls.tls is not None and with_tls.host == "192.0.2.10"
    assert load_server_config(model=test_model_path, host="192.0.2.10", allow_insecure_non_loopback=True).tls is None


def test_tls_file_errors_name_the_file(test_model_path, pki, tmp_path):
    server: Issued = pki["server"]
    missing = tmp_path / "nope.crt"
    with pytest.raises(ConfigError, match=rf"\(tls\): .*{re.escape(str(missing))}: cannot read"):
        load_server_config(model=test_model_path, tls={"cert_file": missing, "key_file": server.key_file})
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("hello")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(garbage))}: not a PEM file"):
        load_server_config(model=test_model_path, tls={"cert_file": garbage, "key_file": server.key_file})
    robot: Issued = pki["robot1"]
    with pytest.raises(ConfigError, match="cannot be used together"):  # another certificate's key
        load_server_config(model=test_model_path, tls={"cert_file": server.cert_file, "key_file": robot.key_file})
    with pytest.raises(ConfigError, match="need mutual TLS"):
        load_server_config(
            model=test_model_path,
            tls={"cert_file": server.cert_file, "key_file": server.key_file},
            auth={"client_identities": ["robot1"]},
        )


# --- remote planner ------------------------------------------------------------------------------


def test_remote_planner_over_mutual_tls(pki):
    server: Issued = pki["server"]
    ca: TestCA = pki["ca"]
    robot: Issued = pki["robot1"]
    server_tls = ServerTLS(cert_file=server.cert_file, key_file=server.key_file, client_ca_file=ca.cert_file)
    with serve_planner(BehaviourPlanner(), port=0, tls=server_tls) as planner:
        client_tls = ClientTLS(ca_file=ca.cert_file, cert_file=robot.cert_file, key_file=robot.key_file)
        remote = RemotePlanner(planner.address, deadline_s=5.0, tls=client_tls)
        assert remote.plan(PlanRequest("car-1", features(), 42)).behaviour == "change_left"
        remote.close()
        plaintext = RemotePlanner(planner.address, deadline_s=5.0)
        with pytest.raises(RemotePlannerError, match="UNAVAILABLE"):
            plaintext.plan(PlanRequest("car-1", features(), 42))
        plaintext.close()
    # the server's configuration reaches the source it builds (in the planner worker)
    cfg = load_server_config(
        model=Path("m.onnx"),
        planner={"source": "remote", "address": "127.0.0.1:1", "tls": {"ca_file": ca.cert_file}},
    ).planner
    built = source_factory(cfg)()
    assert isinstance(built, RemotePlanner) and built.tls is not None and built.tls.ca_file == ca.cert_file


def test_planner_refuses_plaintext_beyond_loopback():
    with pytest.raises(ValueError, match="in plaintext"):
        serve_planner(BehaviourPlanner(), host="192.0.2.10", allow_non_loopback=True)


# --- the command line ----------------------------------------------------------------------------


def test_cli_serves_tls_with_tokens(test_model_path, pki, tokens_file):
    server: Issued = pki["server"]
    env = {k: v for k, v in os.environ.items() if k != "DUALLOOP_TOKENS"} | {"COLUMNS": "300"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dualloop.controller.cli",
            "serve",
            "--model",
            str(test_model_path),
            "--port",
            "0",
            "--tls-cert",
            str(server.cert_file),
            "--tls-key",
            str(server.key_file),
            "--tokens-file",
            str(tokens_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        assert match, line
        assert "TLS, authentication on" in line
        address = f"127.0.0.1:{match.group(1)}"
        with grpc.secure_channel(address, creds(pki["ca"], token=TOKEN_B)) as channel:
            assert len(model_info(channel).features) == 19
        with grpc.secure_channel(address, creds(pki["ca"])) as channel:
            assert rpc_error(model_info, channel).code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(address) as channel:
            rpc_error(model_info, channel)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# --- quotas per scope ----------------------------------------------------------------------------

OTHER_SHADOW_TOKEN = "tok-shadow-99887766554433"


def test_shadow_only_callers_leave_the_reserved_slots_to_actuating_ones(start, tmp_path):
    """4 slots, 2 reserved: a shadow-only token fills its 2, its third open is RESOURCE_EXHAUSTED
    naming the rule, and a full token still opens the remaining 2 (actuating sessions)."""
    from dualloop.executor.config import ExecutorConfig

    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A}\nshadow:{SHADOW_TOKEN}\n")
    srv = start(
        auth=AuthConfig(tokens_file=tokens, tokens_env=None, reserved_actuating_sessions=2),
        executor=ExecutorConfig(max_sessions=4),
    )
    opened = []
    with grpc.insecure_channel(srv.address) as shadow, grpc.insecure_channel(srv.address) as full:
        as_shadow = (("authorization", f"Bearer {SHADOW_TOKEN}"),)
        for k in range(2):
            opened.append(DriveSession(_with(shadow, as_shadow), f"shadow-{k}", pb.CLOCK_MODE_LOCKSTEP, shadow=True))
        err = rpc_error(DriveSession, _with(shadow, as_shadow), "shadow-2", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "shadow-only" in err.details() and "reserved_actuating_sessions 2" in err.details()
        as_full = (("authorization", f"Bearer {TOKEN_A}"),)
        for k in range(2):
            opened.append(DriveSession(_with(full, as_full), f"car-{k}", pb.CLOCK_MODE_LOCKSTEP))
        assert rpc_error(DriveSession, _with(full, as_full), "car-2", pb.CLOCK_MODE_LOCKSTEP).code() == (
            grpc.StatusCode.RESOURCE_EXHAUSTED  # the server is full: the reservation is not extra room
        )
        assert srv.call(lambda: len(srv.server.executor.sessions)) == 4
        for session in opened:
            session.close()


def test_shadow_only_callers_read_only_their_own_sessions_statistics(start, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A}\nshadow:{SHADOW_TOKEN}\nshadow:{OTHER_SHADOW_TOKEN}\n")
    srv = start(auth=AuthConfig(tokens_file=tokens, tokens_env=None))
    me, other, full = ((("authorization", f"Bearer {t}"),) for t in (SHADOW_TOKEN, OTHER_SHADOW_TOKEN, TOKEN_A))
    with grpc.insecure_channel(srv.address) as channel:
        mine = DriveSession(_with(channel, me), "mine", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
        theirs = DriveSession(_with(channel, full), "theirs", pb.CLOCK_MODE_LOCKSTEP)
        for session in (mine, theirs):
            session.send(1, 5_000_000, [20.0] + [0.0] * 18)
            session.recv()
        stats = pb_grpc.ControllerServiceStub(channel).GetShadowStats

        def ask(session_id: str, metadata: tuple, reset: bool = False) -> pb.GetShadowStatsResponse:
            return stats(pb.GetShadowStatsRequest(session_id=session_id, reset=reset), timeout=10, metadata=metadata)

        assert ask("mine", me).session_id == "mine"
        for who, session_id in ((me, "theirs"), (other, "mine")):
            err = rpc_error(ask, session_id, who, reset=True)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "statistics of the sessions it opened" in err.details()
        by_instance = rpc_error(
            stats, pb.GetShadowStatsRequest(session_instance=mine.opened.session_instance), timeout=10, metadata=other
        )
        assert by_instance.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ask("mine", full).session_id == "mine"  # a full caller reads every session, as before
        assert ask("theirs", full).ticks_without_actual > 0  # the refused reset did not happen
        for session in (mine, theirs):
            session.close()


class _with:
    """A channel whose calls all carry this metadata (DriveSession takes a channel)."""

    def __init__(self, channel: grpc.Channel, metadata: tuple) -> None:
        self._channel, self._metadata = channel, metadata

    def stream_stream(self, method: str, *args: object, **kwargs: object):
        call = self._channel.stream_stream(method, *args, **kwargs)
        return lambda requests, **kw: call(requests, metadata=self._metadata, **kw)

    def __getattr__(self, name: str):
        return getattr(self._channel, name)


# --- certificate dates ---------------------------------------------------------------------------


def test_a_server_certificate_out_of_its_dates_is_warned_about_at_start(start, pki, tmp_path, caplog):
    """Served anyway (the clock may be wrong; a reload may bring a good one), but the start says so
    with the dates; a valid certificate starts without the warning."""
    import logging

    from dualloop.planner.tls import validity_problem

    ca: TestCA = pki["ca"]
    expired = ca.server_cert("expired", valid_days=(-30, -1))
    not_yet = ca.server_cert("future", valid_days=(1, 30))
    assert re.fullmatch(
        r"certificate .*expired\.crt has expired: valid from .+ GMT until .+ GMT", validity_problem(expired.cert_file)
    )
    assert "is not valid yet: valid from" in validity_problem(not_yet.cert_file)
    assert validity_problem(pki["server"].cert_file) is None
    with caplog.at_level(logging.WARNING):
        start(tls=ServerTLS(cert_file=expired.cert_file, key_file=expired.key_file))
        start(tls=tls(pki))
    warned = [r for r in caplog.records if r.getMessage() == "server.tls_certificate"]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "expired.crt has expired: valid from" in str(warned[0].__dict__)

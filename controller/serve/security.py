"""Who may call the server: bearer tokens and client-certificate identities, checked on every RPC.

The AuthInterceptor wraps every method handler (except the exempt ones, e.g. health checks) so
that the check runs with the call's context, where both the metadata and the TLS peer's
certificate (auth_context) are visible. A caller that passes gets a Scope in CALLER_SCOPE (a
context variable of the handler's task); the Drive handler reads it where it reads OpenSession,
and a shadow-only caller opening an actuating session gets PERMISSION_DENIED.

Every refusal is UNAUTHENTICATED with one message that depends only on the server's settings,
never on what the caller sent: no hint whether the token was missing, wrong or the certificate.
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import hmac
import inspect
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel, ConfigDict, Field

from dualloop.controller.contract.server_env import TOKENS_ENV

log = logging.getLogger("dualloop.security")

SHADOW_PREFIX = "shadow:"
ADMIN_PREFIX = "admin:"
MIN_TOKEN_CHARS = 16
# Callable without credentials by default: probes (Kubernetes, Envoy) carry no token, and
# reflection describes only the public proto. Prefixes of the full method name.
DEFAULT_EXEMPT = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
)
_RELOAD_CHECK_S = 1.0  # how often a tokens file is checked for changes (one stat call)


class Scope(enum.Enum):
    ADMIN = "admin"  # as FULL, and the admin RPCs (LoadCandidate, PromoteCandidate)
    FULL = "full"  # any session, any RPC but the admin ones
    SHADOW = "shadow"  # Drive only with OpenSession.shadow = true (other RPCs as FULL)


# narrowest first: a caller that presents several credentials gets the narrowest of their scopes
_NARROWEST = (Scope.SHADOW, Scope.FULL, Scope.ADMIN)


# The scope of the RPC the current task serves; None: authentication is off (nothing configured).
CALLER_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("dualloop_caller_scope", default=None)
# Who the caller is, as far as its credentials tell: a digest of its token and certificate
# identities ("": authentication is off). Sessions remember their opener's, so that a shadow-only
# caller reads only its own sessions' statistics.
CALLER_ID: contextvars.ContextVar[str] = contextvars.ContextVar("dualloop_caller_id", default="")


class AuthConfig(BaseModel):
    """Authentication settings; nothing configured (no token, no identity): authentication is off."""

    model_config = ConfigDict(extra="forbid")

    # One token per line; '#' starts a comment; 'shadow:<token>' is shadow-only, 'admin:<token>' may
    # also call the admin RPCs (load and promote a candidate model). Re-read when it
    # changes (replace it atomically: write a new file, then rename it over the old one).
    tokens_file: Path | None = None
    # An environment variable with comma-separated tokens (same 'shadow:' prefix); None: not read.
    tokens_env: str | None = TOKENS_ENV
    # Mutual TLS: client certificate identities (subject CN or a DNS/URI/email SAN) allowed as FULL
    # and as shadow-only callers. Needs tls.client_ca_file. With tokens too, a caller needs both.
    client_identities: list[str] = []
    shadow_client_identities: list[str] = []
    # Client certificate identities allowed to call the admin RPCs (with tokens too: an admin token as well).
    admin_client_identities: list[str] = []
    # Methods callable without credentials (prefixes of '/package.Service/Method').
    exempt_methods: list[str] = list(DEFAULT_EXEMPT)
    # The last session slots (of executor.max_sessions) only callers with a full or admin credential
    # may take: shadow-only callers open sessions while fewer than max_sessions minus this many are
    # open, so shadow stacks can never lock the actuating clients out. At most max_sessions - 1 (a
    # larger value leaves shadow-only callers one slot).
    reserved_actuating_sessions: int = Field(default=8, ge=0)


class AuthError(ValueError):
    """A tokens file or variable that cannot be used; the message names it."""


@dataclass(frozen=True)
class _Token:
    digest: bytes  # sha256 of the token: equal lengths for compare_digest, no token kept in clear
    scope: Scope


def parse_tokens(text: str, source: str, separator: str | None = None) -> list[_Token]:
    """Lines (or separator-split items) of tokens; errors name the source and the line/item."""
    items = text.splitlines() if separator is None else text.split(separator)
    tokens = []
    for n, raw in enumerate(items, 1):
        item = raw.split("#", 1)[0].strip() if separator is None else raw.strip()
        if not item:
            continue
        scope = Scope.FULL
        if item.startswith(SHADOW_PREFIX):
            scope, item = Scope.SHADOW, item[len(SHADOW_PREFIX) :].strip()
        elif item.startswith(ADMIN_PREFIX):
            scope, item = Scope.ADMIN, item[len(ADMIN_PREFIX) :].strip()
        where = f"{source}, {'line' if separator is None else 'item'} {n}"
        if any(c.isspace() for c in item) or not item.isprintable():
            raise AuthError(f"{where}: a token must be one word of printable characters")
        if len(item) < MIN_TOKEN_CHARS:
            raise AuthError(
                f"{where}: token shorter than {MIN_TOKEN_CHARS} characters; generate one with "
                f"python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        tokens.append(_Token(hashlib.sha256(item.encode()).digest(), scope))
    return tokens


def _read_tokens_file(path: Path) -> list[_Token]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise AuthError(f"tokens file {path}: cannot read: {err}") from None
    return parse_tokens(text, f"tokens file {path}")


class TokenStore:
    """The configured tokens (file + environment), the file re-read when it changes.

    A tokens file that cannot be used on a reload (unreadable, deleted, one bad line, no token in
    it) fails closed: every token, the environment's too, is refused until a good file is read. The
    old set cannot be kept: the edit that broke the file may be the one that removed a leaked token.
    """

    def __init__(self, config: AuthConfig, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        value = env.get(config.tokens_env, "") if config.tokens_env else ""
        self._env_tokens = parse_tokens(value, f"environment variable {config.tokens_env}", ",") if value else []
        self._file = config.tokens_file
        self._file_tokens: list[_Token] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self.broken: str | None = None  # why every token is refused now; None: the file is in use
        self.reload_failures = 0  # reloads that failed (each new failure, not each check)
        if self._file is not None:
            self._stamp = self._file_stamp()
            self._file_tokens = _read_tokens_file(self._file)
            if not self._file_tokens:
                raise AuthError(f"tokens file {self._file}: no token in it (an empty file would refuse every caller)")

    @property
    def configured(self) -> bool:
        return self._file is not None or bool(self._env_tokens)

    def _file_stamp(self) -> tuple[int, int]:
        assert self._file is not None
        try:
            st = self._file.stat()
        except OSError as err:
            raise AuthError(f"tokens file {self._file}: cannot read: {err.strerror or err}") from None
        return st.st_mtime_ns, st.st_size

    def _reload(self) -> None:
        """Called under the lock; re-reads the file if its stamp changed."""
        assert self._file is not None
        try:
            stamp = self._file_stamp()
        except AuthError as err:  # deleted or its folder unreadable: a file put back is read whatever its stamp
            self._stamp = None
            self._fail(str(err))
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp  # a bad file is not re-read each check, only once it changes
        try:
            tokens = _read_tokens_file(self._file)
        except AuthError as err:
            self._fail(str(err))
            return
        if not tokens:
            self._fail(f"tokens file {self._file}: no token in it")
            return
        self._file_tokens = tokens
        if self.broken is not None:
            log.warning("tokens file %s usable again: %d token(s); callers admitted again", self._file, len(tokens))
        else:
            log.info("tokens file %s reloaded: %d token(s)", self._file, len(tokens))
        self.broken = None

    def _fail(self, why: str) -> None:
        self._file_tokens = []
        if why != self.broken:  # logged and counted once per failure, not at every check
            self.reload_failures += 1
            log.error("%s; refusing every token until a good tokens file is read", why)
        self.broken = why

    def tokens(self) -> list[_Token]:
        if self._file is not None and time.monotonic() - self._checked >= _RELOAD_CHECK_S:
            with self._lock:
                self._checked = time.monotonic()
                self._reload()
        return [] if self.broken is not None else self._env_tokens + self._file_tokens

    def scope_of(self, presented: str) -> Scope | None:
        """Compares against every token (no early exit), each in constant time."""
        digest = hashlib.sha256(presented.encode()).digest()
        admin = full = shadow = False
        for token in self.tokens():
            equal = hmac.compare_digest(token.digest, digest)
            admin |= equal and token.scope is Scope.ADMIN
            full |= equal and token.scope is Scope.FULL
            shadow |= equal and token.scope is Scope.SHADOW
        return Scope.ADMIN if admin else Scope.FULL if full else Scope.SHADOW if shadow else None


def _bearer(metadata: Sequence[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def peer_identities(auth_context: dict[str, list[bytes]]) -> set[str]:
    """The verified client certificate's subject CN and SANs (gRPC fills these only after a valid handshake)."""
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names.update(v.decode(errors="replace") for v in auth_context.get(key, ()))
    return names


class Authenticator:
    def __init__(self, config: AuthConfig, environ: dict[str, str] | None = None) -> None:
        self.config = config
        self.store = TokenStore(config, environ)
        self.full_ids = set(config.client_identities)
        self.shadow_ids = set(config.shadow_client_identities)
        self.admin_ids = set(config.admin_client_identities)
        self.identities = bool(self.full_ids or self.shadow_ids or self.admin_ids)
        need = []
        if self.store.configured:
            need.append("a valid token as metadata 'authorization: Bearer <token>'")
        if self.identities:
            need.append("a client certificate whose identity is allowed")
        self.refusal = "not authenticated: this server requires " + " and ".join(need)

    @property
    def enabled(self) -> bool:
        return self.store.configured or self.identities

    def scope(self, metadata: Sequence[tuple[str, Any]] | None, auth_context: dict[str, list[bytes]]) -> Scope | None:
        """The caller's scope, or None (refuse). With tokens and identities both, both must pass and
        the narrower scope wins."""
        scopes = []
        if self.store.configured:
            scopes.append(self.store.scope_of(_bearer(metadata)))
        if self.identities:
            names = peer_identities(auth_context)
            scopes.append(
                Scope.ADMIN
                if names & self.admin_ids
                else Scope.FULL
                if names & self.full_ids
                else Scope.SHADOW
                if names & self.shadow_ids
                else None
            )
        if any(s is None for s in scopes):
            return None
        return next(s for s in _NARROWEST if s in scopes)


def caller_id(metadata: Sequence[tuple[str, Any]] | None, auth_context: dict[str, list[bytes]]) -> str:
    """The caller's credentials as a digest (never the token itself): one token, or one set of
    certificate identities, is one caller."""
    h = hashlib.sha256(_bearer(metadata).encode())
    for name in sorted(peer_identities(auth_context)):
        h.update(b"\0" + name.encode())
    return h.hexdigest()[:32]


def _guarded(handler: grpc.RpcMethodHandler, auth: Authenticator) -> grpc.RpcMethodHandler:
    """The same handler, checking the caller first and setting CALLER_SCOPE for its behaviour."""
    if handler.request_streaming and handler.response_streaming:
        behaviour, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        behaviour, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        behaviour, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behaviour, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler

    async def admit(
        context: grpc.aio.ServicerContext,
    ) -> tuple[contextvars.Token[Scope | None], contextvars.Token[str]]:
        metadata, auth_context = context.invocation_metadata(), context.auth_context()
        scope = auth.scope(metadata, auth_context)
        if scope is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, auth.refusal)
        return CALLER_SCOPE.set(scope), CALLER_ID.set(caller_id(metadata, auth_context))

    def release(tokens: tuple[contextvars.Token[Scope | None], contextvars.Token[str]]) -> None:
        CALLER_ID.reset(tokens[1])
        CALLER_SCOPE.reset(tokens[0])

    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(behaviour):

        async def wrapped_gen(request: Any, context: grpc.aio.ServicerContext) -> Any:
            tokens = await admit(context)
            try:
                async for response in behaviour(request, context):
                    yield response
            finally:
                release(tokens)

        wrapped = wrapped_gen
    else:

        async def wrapped_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            tokens = await admit(context)
            try:
                result = behaviour(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                release(tokens)

        wrapped = wrapped_call
    return factory(
        wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth
        self.exempt = tuple(auth.config.exempt_methods)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(self.exempt):
            return handler
        return _guarded(handler, self.auth)


SHADOW_ONLY_RULE = (
    "this caller's credential is shadow-only (a 'shadow:' token or a shadow_client_identities "
    "certificate): it may open only shadow sessions (OpenSession.shadow = true), never an actuating one"
)


async def refuse_actuating_for_shadow_only(context: grpc.aio.ServicerContext, shadow: bool) -> None:
    """Called where OpenSession is read: PERMISSION_DENIED naming the rule."""
    if not shadow and CALLER_SCOPE.get() is Scope.SHADOW:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, SHADOW_ONLY_RULE)


ADMIN_RULE = (
    "this RPC needs an admin credential: an 'admin:<token>' line in the tokens file (or "
    "DUALLOOP_TOKENS), or a certificate in auth.admin_client_identities"
)


async def require_admin(context: grpc.aio.ServicerContext) -> None:
    """Called first by the admin RPCs: PERMISSION_DENIED unless the caller authenticated as ADMIN
    (a server without authentication has no admin: SIGHUP is the way to promote there)."""
    scope = CALLER_SCOPE.get()
    if scope is Scope.ADMIN:
        return
    why = (
        "this server has no authentication configured, so no caller is an admin (send SIGHUP to the "
        "server to promote the candidate loaded with --candidate)"
        if scope is None
        else f"this caller's credential is {scope.value}"
    )
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{ADMIN_RULE}; {why}")


def shadow_only_slots(config: AuthConfig, max_sessions: int) -> int:
    """How many sessions may be open for a shadow-only caller to open one more."""
    return max_sessions - min(config.reserved_actuating_sessions, max_sessions - 1)


async def refuse_shadow_only_past_share(
    context: grpc.aio.ServicerContext, config: AuthConfig, open_now: int, max_sessions: int
) -> None:
    """Called where OpenSession is read: RESOURCE_EXHAUSTED for a shadow-only caller once the
    sessions open reach its share (the other slots are kept for actuating callers)."""
    share = shadow_only_slots(config, max_sessions)
    if CALLER_SCOPE.get() is Scope.SHADOW and open_now >= share:
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{open_now} sessions open: a shadow-only credential may open a session only while fewer than "
            f"{share} are (executor.max_sessions {max_sessions} minus auth.reserved_actuating_sessions "
            f"{max_sessions - share}, kept for actuating callers); retry later",
        )


async def refuse_others_statistics(context: grpc.aio.ServicerContext, owner: str) -> None:
    """GetShadowStats: a shadow-only caller reads (and resets) only the sessions it opened."""
    if CALLER_SCOPE.get() is Scope.SHADOW and CALLER_ID.get() != owner:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            "this caller's credential is shadow-only: it may read the statistics of the sessions it opened "
            "only, and this session was opened with other credentials",
        )

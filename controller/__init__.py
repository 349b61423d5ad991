"""Composition root: server, sessions, clocks, configuration, CLI, benchmarks."""

import os

# The benchmarks start helper processes with fork+exec while gRPC threads run; the children exec
# immediately, so gRPC's fork handlers are not needed (and only print a notice).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

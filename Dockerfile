# The dualloop server: the serving install only (`pip install .`, no extras), a non-root user and a gRPC
# health check. Build and run: docs/operations.md#container. Inside the container the server binds
# loopback unless DUALLOOP_HOST=0.0.0.0 is set, which also needs TLS or the explicit insecure flag.
FROM python:3.11-slim AS build
# a C compiler for the optional C extension (without one the numpy path it is tested against runs)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python -m venv /opt/dualloop \
 && /opt/dualloop/bin/pip install --no-cache-dir /src

FROM python:3.11-slim
COPY --from=build /opt/dualloop /opt/dualloop
COPY docker/healthcheck.py /opt/dualloop/healthcheck.py
# The shipped model and its gates on port 50151, as a configuration file rather than DUALLOOP_*
# variables: variables outrank a file, so a file of the user's (DUALLOOP_CONFIG) would lose to them.
COPY docker/server.toml /opt/dualloop/server.toml
# a home (onnxruntime writes there), and /records owned by the server's user: a named volume mounted
# there takes its owner, so recording works without a chown
RUN useradd --system --uid 10001 --create-home --home-dir /home/dualloop --shell /usr/sbin/nologin dualloop \
 && install -d -o 10001 -g 10001 /records
ENV PATH=/opt/dualloop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DUALLOOP_CONFIG=/opt/dualloop/server.toml
USER 10001:10001
EXPOSE 50151
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/dualloop/healthcheck.py"]
ENTRYPOINT ["dualloop"]
CMD ["serve"]

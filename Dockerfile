# The dualloop server: the serving install only (`pip install .`, no extras), a non-root user and a gRPC
# health check. Build and run: docs/operations.md#container. Inside the container the server binds
# loopback unless DUALLOOP_HOST=0.0.0.0 is set, which also needs TLS or the explicit insecure flag.
FROM python:3.11-slim AS build
# a C compiler for the two optional C extensions (without one the numpy paths they are tested against run)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python -m venv /opt/dualloop \
 && /opt/dualloop/bin/pip install --no-cache-dir /src

FROM python:3.11-slim
COPY --from=build /opt/dualloop /opt/dualloop
COPY docker/healthcheck.py /opt/dualloop/healthcheck.py
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin dualloop
# The shipped model and its gates by default; mount your own and set DUALLOOP_MODEL / DUALLOOP_GATES.
ENV PATH=/opt/dualloop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DUALLOOP_PORT=50151 \
    DUALLOOP_MODEL=/opt/dualloop/lib/python3.11/site-packages/dualloop/models/base.onnx \
    DUALLOOP_GATES='["/opt/dualloop/lib/python3.11/site-packages/dualloop/models/base.gate.npz", "/opt/dualloop/lib/python3.11/site-packages/dualloop/models/base.inputs.gate.npz"]'
USER 10001:10001
EXPOSE 50151
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/dualloop/healthcheck.py"]
ENTRYPOINT ["dualloop"]
CMD ["serve"]

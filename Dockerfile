# The sidecar image: the package and its runtime dependencies only (no test
# extras, no Spark). Build from the repository root:
#   docker build -t kafka-cold-sidecar:0.1.0 .
# The first stage builds the package's wheel, as `make dist` does, from the
# files the package is made of; the second installs that wheel and nothing
# else, so the image holds no source tree and no build tools.
# Runs as uid/gid 10001 with a read-only root file system in
# deploy/kubernetes/daemonset.yaml; the config is mounted at
# /etc/kafka-sidecar/sidecar.toml and the cache disk at /var/cache/kafka-sidecar.
FROM python:3.11-slim AS wheel

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
# pyproject.toml (the metadata, the entry point), README.md (its readme) and the
# package; sidecar/admin/ui.html and py.typed come along as package data.
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=wheel /wheels /tmp/wheels
# The runtime dependencies come from the wheel's metadata: no extras.
RUN pip install /tmp/wheels/kafka_cold_sidecar-*.whl && rm -rf /tmp/wheels

RUN groupadd --system --gid 10001 sidecar \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin sidecar \
    && install -d -o 10001 -g 10001 -m 0750 /var/cache/kafka-sidecar \
    && install -d -m 0755 /etc/kafka-sidecar

WORKDIR /
USER 10001:10001
# 9330: the S3 data port (the plugin's s3.endpoint.url); 9331: admin and /metrics.
EXPOSE 9330 9331
ENTRYPOINT ["sidecar"]
CMD ["serve", "--config", "/etc/kafka-sidecar/sidecar.toml"]

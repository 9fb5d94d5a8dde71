# The sidecar image: the package and its runtime dependencies only (no test
# extras, no Spark). Build from the repository root:
#   docker build -t kafka-cold-sidecar:0.1.0 .
# Runs as uid/gid 10001 with a read-only root file system in
# deploy/kubernetes/daemonset.yaml; the config is mounted at
# /etc/kafka-sidecar/sidecar.toml and the cache disk at /var/cache/kafka-sidecar.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN pip install . && rm -rf /build

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

# The image of the warm-up Job and the capacity analysis CronJob
# (deploy/kubernetes/components/warmup): the package with the warm-up job and its
# `spark` extra (PySpark, boto3, kafka-python), and the Java 17 runtime PySpark
# needs. Spark runs in local mode inside the pod. Build from the repository root:
#   docker build -f warmup.Dockerfile -t kafka-cold-sidecar-warmup:0.1.0 .
# (warmup.Dockerfile.dockerignore, beside it, is the ignore file of this build.)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The Debian release of python:3.11-slim ships Java 17, the one PySpark 4 runs on.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /build
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY spark_warmup ./spark_warmup
RUN pip install ".[spark]" && rm -rf /build

RUN groupadd --system --gid 10001 warmup \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin warmup

WORKDIR /
USER 10001:10001
ENTRYPOINT ["python", "-m"]
CMD ["spark_warmup", "--help"]

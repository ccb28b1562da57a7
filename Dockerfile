# stepserve: one image for the scheduler, the workers and the HTTP gateway.
#   docker build -t stepserve .
# PyPI's torch wheel (a CUDA build on x86_64) runs on GPUs and CPUs alike. For a smaller
# CPU-only image, point pip at a CPU wheel index: --build-arg TORCH_PIP_ARGS="--index-url URL".
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_PIP_ARGS=""

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# A C++ compiler: torch.compile's CPU code and the decode attention kernel are built on first use
# (without one the worker still serves, eagerly and with plain-torch attention).
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN pip install ${TORCH_PIP_ARGS} "${TORCH_SPEC}"
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY scheduler_svc ./scheduler_svc
COPY worker_svc ./worker_svc
COPY client_sdk ./client_sdk
COPY gateway_svc ./gateway_svc
COPY stepserve ./stepserve
COPY benchmarks ./benchmarks
RUN pip install ".[server]"

# The frontend (SDK) and the gateway (HTTP) are meant to be published; workers reach the
# scheduler on the compose network.
EXPOSE 5555 8000
CMD ["python", "-m", "scheduler_svc", "--frontend", "tcp://0.0.0.0:5555", "--worker-address", "tcp://0.0.0.0:5556"]

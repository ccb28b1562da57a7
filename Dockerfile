# stepserve: one image for the scheduler and the workers.
#   docker build -t stepserve .                                   (CPU torch wheel by default)
#   docker build --build-arg TORCH_SPEC="torch==2.13.0" --build-arg TORCH_PIP_ARGS="" -t stepserve:gpu .
FROM python:3.11-slim

# The CPU build of torch keeps the image small; pass your own index for another build.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_PIP_ARGS=""

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN pip install ${TORCH_PIP_ARGS} "${TORCH_SPEC}"
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY scheduler_svc ./scheduler_svc
COPY worker_svc ./worker_svc
COPY client_sdk ./client_sdk
COPY benchmarks ./benchmarks
RUN pip install .

# Only the frontend is meant to be published; workers reach the scheduler on the compose network.
EXPOSE 5555
CMD ["python", "-m", "scheduler_svc", "--frontend", "tcp://0.0.0.0:5555", "--workers", "tcp://0.0.0.0:5556"]

# The image cpmatrix's docker runner starts cuda worlds in (`--gpus`), on a CUDA runtime
# base. Like cpu.Dockerfile, cpmatrix itself is not installed: the runner mounts the
# sources read-only and puts them on PYTHONPATH.
#
# NOT buildable on the project's CPU machines: the base comes from a registry and its
# apt-get needs Debian/Ubuntu mirrors. On a GPU host with a registry and the NVIDIA
# Container Toolkit:
#     docker/build-image.sh cuda
# Pin the base by digest before relying on it (the tag below moves):
#     docker buildx imagetools inspect nvidia/cuda:12.8.1-runtime-ubuntu24.04
#     BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:<digest> docker/build-image.sh cuda
# Ubuntu 24.04's python3 is 3.12, so build-image.sh downloads cp312 wheels for it.
ARG BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${BASE} AS install
ARG WHEELHOUSE=.wheelhouse/cuda
LABEL org.cpmatrix.stage=install
# The CUDA runtime images carry no Python.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY ${WHEELHOUSE} /wheelhouse
COPY requirements-cuda.txt /wheelhouse/requirements.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/python -m pip install --no-index --no-cache-dir \
        --disable-pip-version-check --find-links /wheelhouse -r /wheelhouse/requirements.txt

FROM ${BASE}
# The venv's interpreter is a link to /usr/bin/python3: the final stage needs it too.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=install /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/venv \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="cpmatrix-cuda" \
      org.opencontainers.image.description="Runtime for cpmatrix cuda worlds (torch CUDA, NCCL)"
CMD ["python3"]

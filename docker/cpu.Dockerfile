# The image cpmatrix's docker runner starts cpu worlds in: a Python 3.11 with torch (CPU),
# numpy, pyyaml, junitparser, rich, pytest and triton, installed from a local wheelhouse.
# cpmatrix itself is NOT installed: the runner mounts the project's sources read-only at
# their host paths and puts them on PYTHONPATH, so a source edit needs no rebuild.
#
# Build it with docker/build-image.sh cpu (it downloads the wheelhouse, names the image
# cpmatrix-cpu:<hash of this file, requirements-cpu.txt and the base> and reuses an
# existing one). By hand:
#     docker build -f docker/cpu.Dockerfile --build-arg WHEELHOUSE=.wheelhouse/cpu \
#         -t cpmatrix-cpu:dev docker/
#
# BASE needs no registry: cpmatrix-base:bookworm is made by docker/make-base.sh
# (debootstrap + docker import). Where a registry is reachable, any Debian bookworm image
# with python3 3.11 and venv works, pinned by digest, e.g.
#     --build-arg BASE=python:3.11-slim-bookworm@sha256:<digest>
# (`docker buildx imagetools inspect python:3.11-slim-bookworm` prints the digest).
# Its python3 must be 3.11: the wheelhouse holds cp311 wheels.
ARG BASE=cpmatrix-base:bookworm

# Stage 1 installs into a venv; stage 2 copies only the venv, so the ~400 MB of wheels
# never become a layer of the final image (the legacy builder has no RUN --mount).
FROM ${BASE} AS install
ARG WHEELHOUSE=.wheelhouse/cpu
# build-image.sh removes this stage's image after the build by this label.
LABEL org.cpmatrix.stage=install
COPY ${WHEELHOUSE} /wheelhouse
COPY requirements-cpu.txt /wheelhouse/requirements.txt
# A venv, not the system site-packages: Debian marks its python3 externally managed
# (PEP 668). --no-index: the wheelhouse is the only source, so a build never reaches out.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/python -m pip install --no-index --no-cache-dir \
        --disable-pip-version-check --require-hashes \
        --find-links /wheelhouse -r /wheelhouse/requirements.txt \
    && /opt/venv/bin/python -c "import torch, numpy, yaml, junitparser, rich, pytest, triton; print('torch', torch.__version__)"

FROM ${BASE}
COPY --from=install /opt/venv /opt/venv
# python3 in the container is the venv's: the runner maps the host interpreter in a
# launch's argv to plain `python3`.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/venv \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="cpmatrix-cpu" \
      org.opencontainers.image.description="Runtime for cpmatrix cpu worlds (torch CPU, gloo)"
CMD ["python3"]

#!/usr/bin/env bash
# Build the docker runner's image for a platform, or reuse it when it already exists.
#
# Example:
#     docker/build-image.sh            # cpu: cpmatrix-cpu:<tag>, from cpmatrix-base:bookworm
#     docker/build-image.sh cuda       # on a machine with a registry (see docker/README.md)
#     BASE=python:3.11-slim-bookworm@sha256:<digest> docker/build-image.sh cpu
#
# The tag hashes <platform>.Dockerfile, requirements-<platform>.txt and the base image
# (python -m cpmatrix.supervise.runners.image ref), so an image with the same tag is the same build and is
# reused as is. Prints the image reference as its last line.
set -euo pipefail

platform=${1:-cpu}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
python=${PYTHON:-python3}

# cpmatrix.supervise.runners.image needs only the standard library, so any Python 3.11+ can run it from src/.
image_py() { PYTHONPATH="$root/src" "$python" -m cpmatrix.supervise.runners.image "$@" --docker-dir "$here"; }

base=${BASE:-$(image_py base "$platform")}
if ! docker image inspect "$base" >/dev/null 2>&1; then
    if [[ $base == cpmatrix-base:* ]]; then
        echo "build-image: base image $base is missing; make it with docker/make-base.sh" >&2
        exit 1
    fi
    echo "build-image: pulling $base"
    docker pull "$base"
fi
if [[ $base != cpmatrix-base:* && $base != *@sha256:* ]]; then
    echo "build-image: warning: base $base is not pinned by digest; the image may drift" >&2
fi

ref=$(image_py ref "$platform" --base "$base")
if docker image inspect "$ref" >/dev/null 2>&1; then
    echo "build-image: $ref exists; reusing it"
    echo "$ref"
    exit 0
fi

start=$SECONDS
wheelhouse=$here/.wheelhouse/$platform
requirements=$here/requirements-$platform.txt
rm -rf "$wheelhouse"
mkdir -p "$wheelhouse"
# A list where every wheel carries its hash is a complete lock: download exactly it.
# A list of top-level pins (cuda) lets pip resolve the dependencies.
if grep -q -- '--hash=' "$requirements"; then
    exact=(--no-deps --require-hashes)
else
    exact=()
fi
# Wheels for the image's interpreter, not this one: cpu's base is Debian bookworm
# (python3 3.11), cuda's Ubuntu 24.04 (3.12).
case $platform in
    cuda) image_python=3.12 ;;
    *) image_python=3.11 ;;
esac
"$python" -m pip download -qq "${exact[@]}" --only-binary=:all: \
    --platform "${WHEEL_PLATFORM:-manylinux_2_28_x86_64}" \
    --python-version "${WHEEL_PYTHON:-$image_python}" --implementation cp \
    -r "$requirements" -d "$wheelhouse"
echo "build-image: wheelhouse ready in $((SECONDS - start))s ($(du -sh "$wheelhouse" | cut -f1))"

# The legacy builder (the only one Debian's docker.io 20.10 has) prints a deprecation
# notice with newer clients; DOCKER_BUILDKIT=0 asks for it explicitly.
DOCKER_BUILDKIT=0 docker build --quiet --file "$here/$platform.Dockerfile" \
    --build-arg "BASE=$base" --build-arg "WHEELHOUSE=.wheelhouse/$platform" \
    --tag "$ref" "$here" >/dev/null
rm -rf "$wheelhouse"
# The install stage (wheels + venv, ~2 GB) is only a step; keep the final image only.
docker image prune --force --filter label=org.cpmatrix.stage=install >/dev/null
size=$(docker image inspect --format '{{.Size}}' "$ref")
echo "build-image: built $ref in $((SECONDS - start))s ($((size / 1000000)) MB)"
echo "$ref"

#!/usr/bin/env bash
# Make the local base image `cpmatrix-base:bookworm` with no registry: debootstrap a minimal
# Debian bookworm with Python 3.11 and `docker import` it. Skips all work if the image exists.
#
# Example (as root, with an engine running: docker/start-dockerd.sh):
#     docker/make-base.sh                 # -> cpmatrix-base:bookworm
#     BASE_IMAGE=my-base:1 docker/make-base.sh
#
# Why not a Dockerfile: with no registry reachable there is nothing to put after FROM; a
# root filesystem made by debootstrap from Debian's own mirror is the smallest honest start.
# Python 3.11 matches the host, so the same cp311 wheels fit in the image (shared/FACTS.md).
set -euo pipefail

image=${BASE_IMAGE:-cpmatrix-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "make-base: $image exists ($(docker image inspect --format '{{.Id}}' "$image")); skipping"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "make-base: debootstrap needs root" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

root=$(mktemp -d /var/tmp/cpmatrix-base.XXXXXX)
trap 'rm -rf "$root"' EXIT

start=$SECONDS
echo "make-base: debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
    "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
    echo "make-base: debootstrap failed; last lines of $root.log:" >&2
    tail -n 20 "$root.log" >&2
    exit 1
}
rm -f "$root.log"

# Nothing of the build machine may leak into the image: apt lists and caches are large and
# change daily, and the machine-id must not identify the host that built it.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
: >"$root/etc/machine-id"

tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/usr/bin/python3"]' \
    - "$image" >/dev/null
echo "make-base: $image built in $((SECONDS - start))s:" \
    "$(docker image inspect --format '{{.Id}} {{.Size}}' "$image")"

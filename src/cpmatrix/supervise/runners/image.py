"""Names of the docker runner's images: a tag derived from everything that goes into one.

An image is ``cpmatrix-<flavor>:<tag>`` where ``<flavor>.Dockerfile`` is a platform's
``image:`` and the tag hashes that Dockerfile, the pinned wheel list beside it
(``requirements-<flavor>.txt``) and the base image (its reference and, when present
locally, its id). The same inputs name the same image, so
``docker/build-image.sh`` reuses an image that exists, and an edit to any input names a
new one. Only the tag lives here (pure, plus one ``docker image inspect``); the build is
in ``docker/build-image.sh``, which asks this module for the name:

    python -m cpmatrix.supervise.runners.image ref cpu --docker-dir docker  # cpmatrix-cpu:3f0c..
    python -m cpmatrix.supervise.runners.image base cpu --docker-dir docker # cpmatrix-base:...

Example::

    >>> image_tag(b"FROM x", b"torch==2.13.0", base="x", base_id=None)
    '63aadffb4edf1980'
    >>> default_base("# comment\\nARG BASE=cpmatrix-base:bookworm\\nFROM ${BASE}\\n")
    'cpmatrix-base:bookworm'
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

from cpmatrix.module_names import IMAGE_TOOL

__all__ = [
    "default_base",
    "image_ref",
    "image_tag",
    "local_image_id",
]


#: Bumped when the meaning of the tag changes, so old images are never reused by mistake.
_TAG_SCHEME: Final = b"cpmatrix-image-1"
_ARG_BASE: Final = re.compile(r"^\s*ARG\s+BASE=(\S+)\s*$", re.MULTILINE)


def image_tag(dockerfile: bytes, requirements: bytes, *, base: str, base_id: str | None) -> str:
    """16 hex digits of a sha256 over the inputs (length-prefixed, so no two inputs collide)."""
    digest = hashlib.sha256()
    for part in (_TAG_SCHEME, dockerfile, requirements, base.encode(), (base_id or "").encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


def default_base(dockerfile_text: str) -> str:
    """The default of ``ARG BASE=`` in a Dockerfile (the one place it is written down)."""
    found = _ARG_BASE.search(dockerfile_text)
    if found is None:
        raise ValueError("the Dockerfile has no 'ARG BASE=<image>' line")
    return found.group(1)


def local_image_id(ref: str, *, docker: str = "docker", timeout: float = 30) -> str | None:
    """The id (``sha256:...``) of a local image, or None when absent or docker cannot say."""
    try:
        done = subprocess.run(
            [docker, "image", "inspect", "--format", "{{.Id}}", ref],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    image_id = done.stdout.strip()
    return image_id if done.returncode == 0 and image_id.startswith("sha256:") else None


def _inputs(flavor: str, docker_dir: Path) -> tuple[bytes, bytes]:
    dockerfile = docker_dir / f"{flavor}.Dockerfile"
    requirements = docker_dir / f"requirements-{flavor}.txt"
    for path in (dockerfile, requirements):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: an image needs {flavor}.Dockerfile "
                                    f"and requirements-{flavor}.txt side by side")
    return dockerfile.read_bytes(), requirements.read_bytes()


def image_ref(flavor: str, *, docker_dir: Path, base: str | None = None,
              docker: str = "docker") -> str:
    """``cpmatrix-<flavor>:<tag>`` for the Dockerfile, wheel list and base in ``docker_dir``."""
    dockerfile, requirements = _inputs(flavor, docker_dir)
    base = base or default_base(dockerfile.decode())
    tag = image_tag(
        dockerfile, requirements, base=base, base_id=local_image_id(base, docker=docker)
    )
    return f"cpmatrix-{flavor}:{tag}"


def main(argv: list[str] | None = None) -> int:
    """``python -m cpmatrix.supervise.runners.image {ref,base} PLATFORM [--base IMAGE]``:
    one line."""
    parser = argparse.ArgumentParser(prog=f"python -m {IMAGE_TOOL}",
                                     description=__doc__)
    parser.add_argument("what", choices=("ref", "base"))
    parser.add_argument("platform", help="the image's flavor: <flavor>.Dockerfile")
    parser.add_argument("--base", help="base image (default: the Dockerfile's ARG BASE)")
    parser.add_argument("--docker-dir", type=Path, default=Path("docker"),
                        help="the folder of the Dockerfile (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.what == "base":
            dockerfile, _ = _inputs(args.platform, args.docker_dir)
            print(args.base or default_base(dockerfile.decode()))
        else:
            print(image_ref(args.platform, docker_dir=args.docker_dir, base=args.base))
    except (OSError, ValueError) as exc:
        print(f"{IMAGE_TOOL}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

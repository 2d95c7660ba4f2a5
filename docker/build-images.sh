#!/usr/bin/env bash
# Build the minibroker image: the base image (cached), the wheels, then the image.
#
#   docker/build-images.sh [--base IMAGE] [--tag IMAGE] [--rebuild-base] [--wheels-only]
#
#   --base IMAGE     base image [minibroker-base:bookworm]. A minibroker-base:* name is
#                    built locally by docker/build-base.sh (Debian via debootstrap, for
#                    machines without a registry) unless it exists; any other name (e.g.
#                    python:3.11-slim) is used as is, pulled by docker if it must be.
#   --tag IMAGE      the image to build [minibroker:latest]
#   --rebuild-base   rebuild the local base image even if it exists
#   --wheels-only    only build docker/wheels/ (then `docker build -f docker/Dockerfile .`)
#
# Environment: MINIBROKER_BASE_IMAGE, MINIBROKER_IMAGE (same as the flags);
# PYTHON: the interpreter that builds the wheels [.venv/bin/python, else python3.11,
# else python3]. The image runs CPython 3.11 on glibc 2.36 (bookworm): with a host
# Python 3.11 the wheels come from `pip wheel`; with another version, pip downloads
# cp311 manylinux binary wheels instead. Network: PyPI only (or pip's own cache).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
wheels="$here/wheels"

log() { printf 'build-images: %s\n' "$*" >&2; }
die() {
    printf 'build-images: error: %s\n' "$*" >&2
    exit 1
}

base="${MINIBROKER_BASE_IMAGE:-minibroker-base:bookworm}"
tag="${MINIBROKER_IMAGE:-minibroker:latest}"
rebuild_base=0
wheels_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --base | --tag)
        [ $# -ge 2 ] || die "$1 needs an image name"
        if [ "$1" = --base ]; then base="$2"; else tag="$2"; fi
        shift
        ;;
    --base=*) base="${1#--base=}" ;;
    --tag=*) tag="${1#--tag=}" ;;
    --rebuild-base) rebuild_base=1 ;;
    --wheels-only) wheels_only=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done

# ---------------------------------------------------------------- 1. base image

base_seconds=0
if [ "$wheels_only" -eq 0 ]; then
    command -v docker >/dev/null 2>&1 || die "docker is not installed (need Docker Engine and its CLI)"
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
        die "cannot reach the Docker daemon: is it running, and may $(id -un) use it (docker group or root)?"
    case "$base" in
    minibroker-base:*)
        started=$SECONDS
        base_args=(--name "$base")
        [ "$rebuild_base" -eq 1 ] && base_args+=(--force)
        "$here/build-base.sh" "${base_args[@]}"
        base_seconds=$((SECONDS - started))
        ;;
    *) [ "$rebuild_base" -eq 0 ] || die "--rebuild-base only applies to a minibroker-base:* image, not $base" ;;
    esac
fi

# ---------------------------------------------------------------- 2. wheels

python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in "$root/.venv/bin/python" python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then
            python="$candidate"
            break
        fi
    done
fi
[ -n "$python" ] || die "no Python found to build the wheels: set PYTHON=/path/to/python3"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip: set PYTHON to a Python with pip (e.g. a venv's)"
py_version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

started=$SECONDS
workdir="$(mktemp -d "${TMPDIR:-/tmp}/minibroker-wheels.XXXXXX")"
trap 'rm -rf "$workdir"' EXIT

# Build from a clean copy of the source: an in-tree build would leave build/ in the
# checkout, and a stale build/lib can put deleted modules into the wheel.
tar -C "$root" -c \
    --exclude=./.git --exclude=./.venv --exclude='./.*_cache' --exclude=./.hypothesis \
    --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=./minibroker-data --exclude=./docker --exclude=./tests --exclude=./bench \
    . | tar -C "$workdir" -x || die "cannot copy the source tree to $workdir"
mkdir -p "$workdir/out"

pip_opts=(--disable-pip-version-check --quiet --wheel-dir "$workdir/out")
# Fixed zip timestamps: the same source gives a byte-identical wheel, so docker's build
# cache is reused when nothing changed.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-315532800}"
if [ "$py_version" = "3.11" ]; then
    log "building wheels with $python (Python $py_version)"
    timeout 900 "$python" -m pip wheel "${pip_opts[@]}" "$workdir" ||
        die "pip wheel failed (see above); it needs PyPI or pip's cache for the dependencies"
else
    # Another Python: build the project (pure Python) here, fetch cp311 binary wheels for
    # the dependencies, for bookworm's glibc 2.36 and this machine's architecture.
    arch="$(uname -m)"
    log "building wheels with $python (Python $py_version): dependencies as CPython 3.11 manylinux wheels for $arch"
    timeout 900 "$python" -m pip wheel "${pip_opts[@]}" --no-deps "$workdir" || die "pip wheel failed (see above)"
    platforms=(--platform "manylinux2014_$arch")
    for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
    timeout 900 "$python" -m pip download --disable-pip-version-check --quiet \
        --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
        "${platforms[@]}" --dest "$workdir/out" "$workdir"/out/minibroker-*.whl ||
        die "pip download of cp311 wheels failed (see above); or set PYTHON to a Python 3.11"
fi

# Replace the wheel set as a whole, so no stale version stays behind. The project's
# wheel goes apart from its dependencies' (project/, deps/): the image installs the
# dependencies in a layer docker reuses while only the project changes.
mkdir -p "$wheels/deps" "$wheels/project"
find "$wheels" -name '*.whl' -delete
for whl in "$workdir"/out/*.whl; do
    case "$(basename "$whl")" in
    minibroker-*) cp "$whl" "$wheels/project/" ;;
    *) cp "$whl" "$wheels/deps/" ;;
    esac
done
wheel_seconds=$((SECONDS - started))
log "wheels in ${wheels#"$root"/}/ (${wheel_seconds}s): $(find "$wheels" -name '*.whl' -printf '%P ')"
[ "$wheels_only" -eq 0 ] || exit 0

# ---------------------------------------------------------------- 3. the image

# Without the buildx plugin the docker CLI falls back to the classic builder; say so
# explicitly rather than let DOCKER_BUILDKIT=1 fail.
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi

log "docker build -t $tag --build-arg BASE_IMAGE=$base -f docker/Dockerfile ."
started=$SECONDS
timeout 1800 docker build --tag "$tag" --build-arg "BASE_IMAGE=$base" \
    --file "$here/Dockerfile" "$root" || die "docker build failed (see above)"
image_seconds=$((SECONDS - started))
# Keep the venv stage tagged (it is the build cache), then drop the images this build
# superseded: untagged leaves carrying our stage label, nobody else's.
if ! docker build --quiet --target build --tag minibroker-build:latest --build-arg "BASE_IMAGE=$base" \
    --file "$here/Dockerfile" "$root" >"$workdir/stage.out" 2>&1; then
    cat "$workdir/stage.out" >&2
    die "tagging the build stage as minibroker-build:latest failed (output above)"
fi
docker image prune --force --filter dangling=true --filter label=minibroker.stage >/dev/null ||
    log "could not remove superseded images (docker image prune); continuing"

size="$(docker image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
log "built $tag ($size) from $base: base ${base_seconds}s, wheels ${wheel_seconds}s, image ${image_seconds}s"

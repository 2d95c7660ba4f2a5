#!/usr/bin/env bash
# Build the local base image minibroker-base:bookworm from Debian with debootstrap, for
# machines with Docker Engine but no container registry (nothing can be pulled).
#
#   docker/build-base.sh [--force] [--name IMAGE]
#
# Cached: does nothing when IMAGE already exists and was built from the same package
# list (label minibroker.base.packages); --force rebuilds it.
#
# The Debian mirror comes from this machine's own apt sources (deb822 `URIs:`/`Suites:` in
# /etc/apt/sources.list.d/*.sources, or `deb` lines in /etc/apt/sources.list{,.d/*.list});
# no mirror host is written in this repository. The suite is bookworm because the image
# must run Python 3.11 (bookworm's python3), whatever release the host runs.
#
# Environment (all optional):
#   MINIBROKER_BASE_IMAGE          image name            [minibroker-base:bookworm]
#   MINIBROKER_DEBIAN_SUITE        Debian suite          [bookworm]
#   MINIBROKER_DEBIAN_MIRROR       mirror URI            [from the apt sources]
#   MINIBROKER_BASE_EXTRA_PACKAGES extra packages, comma- or space-separated
#   MINIBROKER_DEBOOTSTRAP_TIMEOUT seconds for debootstrap [900]
#   MINIBROKER_BUILD_TMP           where the root file system is staged [/var/tmp]
set -euo pipefail

# python3 + python3-venv: the interpreter and ensurepip (python3-venv pulls python3-pip-whl,
# so `python3 -m venv` gets pip without network). ca-certificates: TLS for tools.
# procps + iproute2: ps/kill/ip/ss/tc for debugging and the chaos tests. netbase:
# /etc/services and /etc/protocols, as in the python:3.11-slim image.
PACKAGES="python3,python3-venv,ca-certificates,procps,iproute2,netbase"

log() { printf 'build-base: %s\n' "$*" >&2; }
die() {
    printf 'build-base: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

force=0
suite="${MINIBROKER_DEBIAN_SUITE:-bookworm}"
name="${MINIBROKER_BASE_IMAGE:-minibroker-base:${suite}}"
while [ $# -gt 0 ]; do
    case "$1" in
    --force) force=1 ;;
    --name)
        [ $# -ge 2 ] || die "--name needs an image name, e.g. --name minibroker-base:bookworm"
        name="$2"
        shift
        ;;
    --name=*) name="${1#--name=}" ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done
[ -n "$name" ] || die "the image name is empty (--name or MINIBROKER_BASE_IMAGE)"

extra="${MINIBROKER_BASE_EXTRA_PACKAGES:-}"
if [ -n "$extra" ]; then
    extra="$(printf '%s' "$extra" | tr -s ' ,' ',,' | sed 's/^,//;s/,$//')"
    PACKAGES="${PACKAGES},${extra}"
fi
debootstrap_timeout="${MINIBROKER_DEBOOTSTRAP_TIMEOUT:-900}"
case "$debootstrap_timeout" in
'' | *[!0-9]*) die "MINIBROKER_DEBOOTSTRAP_TIMEOUT must be a number of seconds, not '$debootstrap_timeout'" ;;
esac

# ---------------------------------------------------------------- docker and the cache

command -v docker >/dev/null 2>&1 || die "docker is not installed (need Docker Engine and its CLI)"
if ! docker_err="$(docker version --format '{{.Server.Version}}' 2>&1 >/dev/null)"; then
    if [ "$(id -u)" -ne 0 ]; then
        die "cannot reach the Docker daemon as $(id -un): is it running, and are you in the 'docker' group (or run as root)? docker said: ${docker_err}"
    fi
    die "cannot reach the Docker daemon: is it running (systemctl start docker)? docker said: ${docker_err}"
fi

if [ "$force" -eq 0 ] && docker image inspect "$name" >/dev/null 2>&1; then
    built_with="$(docker image inspect --format '{{ index .Config.Labels "minibroker.base.packages" }}' "$name" 2>/dev/null || true)"
    if [ "$built_with" = "$PACKAGES" ]; then
        log "$name exists; nothing to do (--force rebuilds it)"
        exit 0
    fi
    log "$name exists but was built with packages '${built_with:-?}', not '$PACKAGES': rebuilding"
fi

# ---------------------------------------------------------------- root

if [ "$(id -u)" -ne 0 ]; then
    # debootstrap needs root (chroot, device nodes, file ownership); so does reading the tree.
    if command -v sudo >/dev/null 2>&1; then
        log "not root: re-running under sudo"
        again=(--name "$name")
        [ "$force" -eq 1 ] && again+=(--force)
        exec sudo --preserve-env=MINIBROKER_DEBIAN_SUITE,MINIBROKER_DEBIAN_MIRROR,MINIBROKER_BASE_EXTRA_PACKAGES,MINIBROKER_DEBOOTSTRAP_TIMEOUT,MINIBROKER_BUILD_TMP,http_proxy,https_proxy,no_proxy \
            -- "$(readlink -f "$0")" "${again[@]}"
    fi
    die "debootstrap needs root: run this script as root (sudo is not installed)"
fi

# ---------------------------------------------------------------- the mirror

# Print "URI SUITE" for every enabled binary (`deb`) source of this machine, one a line.
apt_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822: stanzas separated by blank lines; fields may hold several values.
        awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled !~ /^[Nn][Oo]$/ && uris != "" && suites != "") {
                    nu = split(uris, u, " "); ns = split(suites, s, " ")
                    for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]/ { next }  # continuation line (e.g. an inline Signed-By key)
            {
                line = $0; key = tolower(line); sub(/:.*/, "", key)
                val = line; sub(/^[^:]*:[ \t]*/, "", val); gsub(/[ \t]+/, " ", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "enabled") enabled = val
            }
            END { flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        # deb [options] URI SUITE COMPONENTS...
        awk '
            { sub(/#.*/, "") }
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if (i + 1 <= NF) print $i, $(i + 1)
            }
        ' "$f"
    done
}

mirror="${MINIBROKER_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
    sources="$(apt_sources | awk '$1 ~ /^(https?|file):\/\//' || true)"
    [ -n "$sources" ] || die "no apt sources found (looked for URIs:/Suites: in /etc/apt/sources.list.d/*.sources and 'deb' lines in /etc/apt/sources.list and /etc/apt/sources.list.d/*.list); set MINIBROKER_DEBIAN_MIRROR to a Debian mirror URI"
    # Prefer the entry for our suite; else the first plain release suite (not -updates,
    # -security, -backports): a Debian mirror carries every release.
    mirror="$(printf '%s\n' "$sources" | awk -v s="$suite" '$2 == s { print $1; exit }')"
    if [ -z "$mirror" ]; then
        mirror="$(printf '%s\n' "$sources" | awk '$2 !~ /[-\/]/ { print $1; exit }')"
        [ -n "$mirror" ] || die "no Debian release suite in the apt sources (found: $(printf '%s' "$sources" | tr '\n' ';')); set MINIBROKER_DEBIAN_MIRROR"
        log "the apt sources have no '$suite' entry; using their mirror $mirror for $suite (MINIBROKER_DEBIAN_MIRROR overrides)"
    fi
fi
log "suite $suite from $mirror"

# debootstrap downloads with wget, which does not read apt's proxy settings.
if [ -z "${http_proxy:-}" ] && command -v apt-config >/dev/null 2>&1; then
    apt_proxy=""
    eval "$(apt-config shell apt_proxy Acquire::http::Proxy)"
    if [ -n "$apt_proxy" ] && [ "$apt_proxy" != "DIRECT" ]; then
        export http_proxy="$apt_proxy"
        log "using apt's HTTP proxy $apt_proxy"
    fi
fi

# ---------------------------------------------------------------- debootstrap

if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get to install it; install debootstrap"
    log "installing debootstrap"
    timeout 600 apt-get update -qq -o Acquire::Retries=3 || die "apt-get update failed (see above)"
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq -o Acquire::Retries=3 debootstrap >/dev/null ||
        die "apt-get install debootstrap failed (see above)"
fi

stage_parent="${MINIBROKER_BUILD_TMP:-/var/tmp}"
workdir="$(mktemp -d "${stage_parent}/minibroker-base.XXXXXX")" || die "cannot create a directory in $stage_parent (set MINIBROKER_BUILD_TMP)"
rootfs="$workdir/rootfs"

cleanup() {
    local status=$? mnt
    # debootstrap mounts proc/sys (and may bind /dev entries) in the target; a killed
    # debootstrap leaves them: unmount before deleting, deepest first, and never cross
    # into another file system while deleting.
    if [ -d "$workdir" ]; then
        while read -r mnt; do
            umount -l "$mnt" 2>/dev/null || true
        done < <(awk -v p="$workdir/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r)
        rm -rf --one-file-system "$workdir" || log "could not remove $workdir completely"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "debootstrap --variant=minbase --include=$PACKAGES $suite (timeout ${debootstrap_timeout}s)"
started=$SECONDS
rc=0
timeout --kill-after=30 "$debootstrap_timeout" \
    debootstrap --variant=minbase --include="$PACKAGES" "$suite" "$rootfs" "$mirror" \
    >"$workdir/debootstrap.out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
    tail -n 20 "$workdir/debootstrap.out" >&2 || true
    if [ -f "$rootfs/debootstrap/debootstrap.log" ]; then
        log "last lines of debootstrap.log:"
        tail -n 20 "$rootfs/debootstrap/debootstrap.log" >&2
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        die "debootstrap of $suite from $mirror timed out after ${debootstrap_timeout}s (raise MINIBROKER_DEBOOTSTRAP_TIMEOUT, or check the mirror)"
    fi
    die "debootstrap of $suite from $mirror failed (exit $rc; output above): check the mirror (MINIBROKER_DEBIAN_MIRROR overrides it)"
fi
log "debootstrap done in $((SECONDS - started))s"

[ -x "$rootfs/usr/bin/python3.11" ] || die "the $suite tree has no /usr/bin/python3.11 (the image needs Python 3.11: use suite bookworm)"

# Slim the tree the way Debian's slim images do: apt caches, docs (but not copyright
# files), man pages, locales. Docker provides hostname, hosts and resolv.conf at run time.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
log "root file system: $(du -sh --one-file-system "$rootfs" | cut -f1)"

log "importing as $name"
started=$SECONDS
tar --numeric-owner -C "$rootfs" -c . |
    timeout 900 docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL org.opencontainers.image.title=minibroker-base org.opencontainers.image.description=\"Debian $suite minbase + Python 3.11, built by docker/build-base.sh\" minibroker.base.suite=$suite minibroker.base.packages=$PACKAGES" \
        --message "debootstrap --variant=minbase $suite" \
        - "$name" >/dev/null
log "import done in $((SECONDS - started))s"

# The one thing the Dockerfile relies on: a venv with pip, made without network.
if ! check="$(docker run --rm --network none "$name" sh -c \
    'python3 -m venv /tmp/v && /tmp/v/bin/python -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" && /tmp/v/bin/python -m pip --version' 2>&1)"; then
    docker image rm "$name" >/dev/null 2>&1 || true
    die "the new image cannot make a Python 3.11 venv with pip (removed it): $check"
fi
log "built $name ($(docker image inspect --format '{{.Size}}' "$name" | awk '{ printf "%.0f MB", $1 / 1e6 }')); venv check: $check"

#!/usr/bin/env bash
# Builds Tessera's container images on this machine, without a registry: tessera/coordinator, tessera/agent,
# tessera/sim-agent (with the `standin` jobs), tessera/router and tessera/replay, each tagged with the workspace
# version and `latest`.
#
# Each image is `FROM scratch` with one release binary, the shared libraries the dynamic loader resolves for it (as
# `ldd` lists them: libc, libm, libstdc++, libgcc_s and the loader), a passwd entry for the unprivileged user it runs
# as (uid and gid 65532, `tessera`), a writable /data for its state and /tmp; no shell, no package manager, no build
# tools. The coordinator image carries the model profiles (/etc/tessera/models); the replay image works in
# /usr/share/tessera, which holds the bundled traces and configs, so its defaults find them. The agent is built with
# its NVML backend (libnvidia-ml is loaded at run time from the host, e.g. through the NVIDIA container toolkit).
#
# Usage: deploy/build-images.sh [--profile release|debug] [--no-build]
#   --profile debug packages the debug build (quicker to build; CI's fault test uses it); --no-build packages the
#   binaries already in target/<profile>.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! command -v docker >/dev/null 2>&1; then
  echo "build-images: docker is not installed" >&2
  exit 1
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
if [ -z "$version" ]; then
  echo "build-images: no workspace version in Cargo.toml" >&2
  exit 1
fi

profile=release
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "build-images: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) cargo_profile=(--release) ;;
  debug) cargo_profile=() ;;
  *) echo "build-images: --profile release or debug" >&2; exit 2 ;;
esac
if [ "$build" = 1 ]; then
  scripts/cargo build "${cargo_profile[@]}" --locked -p tessera-coordinator -p tessera-agent -p tessera-sim \
    -p tessera-router -p tessera-replay --features tessera-agent/nvml
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# image NAME [SRC:DEST ...] [-- WORKDIR]: packages target/release/NAME and the files SRC (copied to DEST).
image() {
  local name=$1
  shift
  local bin="target/$profile/$name"
  if [ ! -x "$bin" ]; then
    echo "build-images: $bin is missing (build it, or run without --no-build)" >&2
    exit 1
  fi
  local workdir=/data
  local ctx="$work/$name"
  local rootfs="$ctx/rootfs"
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" "$ctx/data"
  chmod 1777 "$rootfs/tmp"
  install -m 0755 "$bin" "$rootfs/usr/local/bin/$name"
  strip "$rootfs/usr/local/bin/$name" 2>/dev/null || true
  # The loader and every library it resolves (symlinks followed, kept at the paths the binary asks for).
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u | while read -r lib; do
    cp -L --parents "$lib" "$rootfs"
  done
  printf 'root:x:0:0:root:/:/nonexistent\ntessera:x:65532:65532:tessera:/data:/nonexistent\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\ntessera:x:65532:\n' >"$rootfs/etc/group"
  while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then
      workdir=$2
      shift 2
      continue
    fi
    local src=${1%%:*} dest=${1#*:}
    mkdir -p "$rootfs$(dirname "$dest")"
    cp -r "$src" "$rootfs$dest"
    shift
  done
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 data/ /data/
USER 65532:65532
WORKDIR $workdir
ENTRYPOINT ["/usr/local/bin/$name"]
LABEL org.opencontainers.image.title="tessera-$name" org.opencontainers.image.version="$version" \
      org.opencontainers.image.licenses="Apache-2.0"
DOCKERFILE
  if ! docker build --quiet -t "tessera/$name:$version" -t "tessera/$name:latest" "$ctx" >"$ctx/build.log" 2>&1; then
    cat "$ctx/build.log" >&2
    exit 1
  fi
  local bytes
  bytes=$(docker image inspect --format '{{.Size}}' "tessera/$name:$version")
  printf 'tessera/%s:%s %s MB\n' "$name" "$version" "$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')"
}

image coordinator configs/models:/etc/tessera/models configs/coordinator.toml:/etc/tessera/coordinator.toml
image agent configs/agent.toml:/etc/tessera/agent.toml
image sim-agent "target/$profile/standin:/usr/local/bin/standin"
image router
image replay configs:/usr/share/tessera/configs traces:/usr/share/tessera/traces -- /usr/share/tessera

#!/usr/bin/env bash
# Install the Debian 12 packages pdde builds, tests and runs against.
#
#   bash tools/install-deps.sh           # build + test dependencies
#   bash tools/install-deps.sh --torch   # also python3-torch and python3-numpy (only for
#                                        # tools/gen_golden.py and tools/bench/gpt_torch.py)
#   bash tools/install-deps.sh --check   # exit 0 if everything is installed, 1 if not
#
# Idempotent: when every package is already installed it does nothing (no apt-get update).
# Runs as root; uses sudo when not root and sudo exists (without asking for a password).
# Offline (a node without network): it first tries a TCP connection to apt's first package source, or to
# its proxy, for INSTALL_DEPS_PROBE_S seconds (5); where none opens it installs nothing and says so (exit 1)
# instead of waiting on apt. PDDE_OFFLINE=1 skips apt altogether.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libopenblas-dev libdnnl-dev
  ocl-icd-opencl-dev ocl-icd-libopencl1 pocl-opencl-icd libclblast-dev opencl-c-headers clinfo
  libucx-dev ucx-utils
  libhwloc-dev
  libcjson-dev
  etcd-server etcd-client
  openmpi-bin libopenmpi-dev
  fortunes
  libze-dev libze1 llvm-spirv-15 clang-15
  libcurl4-openssl-dev
  iproute2 procps
)
TORCH_PKGS=(python3-torch python3-numpy)

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
  case "$arg" in
    --torch) PKGS+=("${TORCH_PKGS[@]}") ;;
    --check) CHECK_ONLY=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [ "$status" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ -n "${CHECK_ONLY:-}" ]; then
  [ "${#missing[@]}" -eq 0 ] && echo "install-deps: all installed" && exit 0
  echo "install-deps: missing: ${missing[*]}"; exit 1
fi

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed; nothing to do"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
  else
    echo "install-deps: not root and sudo not found; run as root" >&2
    exit 1
  fi
fi

echo "install-deps: missing ${#missing[@]} package(s): ${missing[*]}"
offline() { # WHY
  echo "install-deps: $1: not installing the ${#missing[@]} missing package(s); what needs them is left out" >&2
  exit 1
}
[ "${PDDE_OFFLINE:-0}" = 1 ] && offline "PDDE_OFFLINE=1"
command -v apt-get >/dev/null 2>&1 || offline "no apt-get here"

# Where apt would fetch from: its first source, or the proxy for that source's scheme (Acquire::http::Proxy
# or Acquire::https::Proxy, else \$http_proxy or \$https_proxy; DIRECT: none).
reachable() { # HOST PORT: a TCP connection within INSTALL_DEPS_PROBE_S seconds
  timeout "${INSTALL_DEPS_PROBE_S:-5}" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}
src=$(apt-get indextargets --no-release-info --format '$(URI)' 2>/dev/null | head -1 || true)
scheme=http
case "$src" in https://*) scheme=https ;; esac
Proxy=
eval "$(apt-config shell Proxy "Acquire::$scheme::Proxy" 2>/dev/null)"
if [ -z "$Proxy" ]; then
  if [ $scheme = https ]; then Proxy=${https_proxy:-}; else Proxy=${http_proxy:-}; fi
fi
[ "$Proxy" = DIRECT ] && Proxy=
target=${Proxy:-$src}
case "$target" in
  http://* | https://*) # (another kind of source, or none found: apt is left to tell)
    hostport=${target#*://}
    hostport=${hostport%%/*}
    hostport=${hostport##*@}
    host=${hostport%:*}
    port=${hostport##*:}
    if [ "$host" = "$hostport" ]; then case "$target" in https:*) port=443 ;; *) port=80 ;; esac; fi
    reachable "$host" "$port" ||
      offline "no network: ${host}:${port} (apt's $([ -n "$Proxy" ] && echo proxy || echo source)) could not be reached (a TCP connection within ${INSTALL_DEPS_PROBE_S:-5} s)"
    ;;
esac

export DEBIAN_FRONTEND=noninteractive

# Run a command, retrying once after a short pause if it fails.
retry() {
  if "$@"; then return 0; fi
  echo "install-deps: '$*' failed; retrying once in 5 s" >&2
  sleep 5
  "$@"
}

echo "install-deps: + apt-get update"
retry "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update

echo "install-deps: + apt-get install -y --no-install-recommends ${missing[*]}"
retry "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"

echo "install-deps: done"

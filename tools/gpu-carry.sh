#!/usr/bin/env bash
# shellcheck disable=SC2016 # ($ORIGIN and dpkg-deb's ${Package} are meant literally)
# tools/gpu-carry.sh — UCX for a machine that has none and cannot install it (a GPU node without network
# or Debian's packages), carried in a git-ignored folder of this repository.
#
#   bash tools/gpu-carry.sh [DIR]     # DIR defaults to .gpu-carry (in the repository root)
#
# Downloads Debian 12's libucx0 and libucx-dev (apt-get download: needs apt and network here, not root),
# with the shared libraries they need that a minimal image may lack (libnuma, libibverbs, librdmacm,
# libmlx5, libnl), unpacks them with dpkg -x and lays them out as UCX_DIR wants:
#   DIR/ucx/include/{ucp,uct,ucs,ucm}   headers
#   DIR/ucx/lib/lib*.so.N               the libraries under their SONAMEs (no symbolic links)
#   DIR/ucx/lib/lib{ucp,uct,ucs,ucm}.so linker scripts naming those, for -lucp etc.
#   DIR/ucx/lib/ucx/libuct_*.so.0       UCX's transport modules (found beside libucs.so.0)
#   DIR/ucx/bin/ucx_info                UCX's own check (LD_LIBRARY_PATH=DIR/ucx/lib DIR/ucx/bin/ucx_info -d)
# `make UCX_DIR=$PWD/DIR/ucx` builds against it (the Makefile also takes .gpu-carry/ucx by itself where
# pkg-config finds no UCX); programs find the libraries through their RPATH. Needs only glibc at run time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.gpu-carry}
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac

# (of ibverbs-providers only libmlx5, which UCX's ib module needs; of ucx-utils only ucx_info)
pkgs=(libucx0 libucx-dev ucx-utils libnuma1 libibverbs1 librdmacm1 ibverbs-providers libnl-3-200 libnl-route-3-200
      patchelf) # (patchelf only runs here: it points each library's RUNPATH at the folder itself)
# what any x86-64 glibc system has (a NEEDED entry outside the carried folder must be one of these)
base='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so'

for t in apt-get dpkg readelf; do
    command -v "$t" >/dev/null || { echo "gpu-carry: $t not found (run this on Debian 12 with apt)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
echo "gpu-carry: apt-get download ${pkgs[*]}"
if ! (cd "$work/debs" && apt-get download "${pkgs[@]}" >"$work/apt.log" 2>&1); then
    cat "$work/apt.log" >&2
    echo "gpu-carry: apt-get download failed (no network, or not Debian 12's archive?)" >&2
    exit 1
fi
for d in "$work"/debs/*.deb; do dpkg -x "$d" "$work/root"; done
r=$work/root/usr
m=$r/lib/x86_64-linux-gnu

rm -rf "$dir/ucx"
mkdir -p "$dir/ucx/include" "$dir/ucx/lib/ucx" "$dir/ucx/bin"
cp -r "$r"/include/{ucp,uct,ucs,ucm} "$dir/ucx/include/"
# a library under its SONAME: the real file, copied (the device tool may not carry links)
put() { # FILE DEST_DIR
    local so
    so=$(readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    cp -L "$1" "$2/${so:-$(basename "$1")}"
}
shopt -s nullglob
for l in ucp uct ucs ucm ucs_signal numa ibverbs rdmacm mlx5 nl-3 nl-route-3; do
    f=("$m/lib$l".so.*.* "$work/root/lib/x86_64-linux-gnu/lib$l".so.*.*) # (libnl is in /lib)
    [ ${#f[@]} = 1 ] || { echo "gpu-carry: lib$l: found ${#f[@]} files, expected 1: ${f[*]}" >&2; exit 1; }
    put "${f[0]}" "$dir/ucx/lib"
done
for f in "$m"/ucx/libuct_*.so.*.*; do put "$f" "$dir/ucx/lib/ucx"; done
for l in ucp uct ucs ucm; do # (ld reads a text file as a linker script; it finds the named file on -L)
    echo "INPUT($(cd "$dir/ucx/lib" && ls lib$l.so.[0-9]*))" >"$dir/ucx/lib/lib$l.so"
done
cp "$r/bin/ucx_info" "$dir/ucx/bin/"
# Each finds what it needs beside itself ($ORIGIN), whatever the program's RPATH or LD_LIBRARY_PATH: libucs
# its libnuma, a module (lib/ucx) the other modules and lib/, ucx_info lib/ (Debian's modules carry
# RUNPATH /usr/lib/x86_64-linux-gnu/ucx, which is not there on the machine this goes to).
pe() { LD_LIBRARY_PATH=$m${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$r/bin/patchelf" "$@"; }
for f in "$dir"/ucx/lib/*.so.*; do pe --set-rpath '$ORIGIN' "$f"; done
for f in "$dir"/ucx/lib/ucx/*.so.*; do pe --set-rpath '$ORIGIN:$ORIGIN/..' "$f"; done
pe --set-rpath '$ORIGIN/../lib' "$dir/ucx/bin/ucx_info"
versions=$(for d in "$work"/debs/*.deb; do dpkg-deb --showformat='${Package}=${Version}\n' -W "$d"; done | grep -v '^patchelf=')
{
    echo "# UCX from Debian 12 (tools/gpu-carry.sh, $(date -u +%Y-%m-%d)): make UCX_DIR=\$PWD/${dir#"$root"/}/ucx"
    echo "$versions"
} >"$dir/ucx/PACKAGES"

# every library and module must find what it needs in the folder or in glibc's own set
bad=0
for f in "$dir"/ucx/lib/*.so.* "$dir"/ucx/lib/ucx/*.so.* "$dir/ucx/bin/ucx_info"; do
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        [ -f "$dir/ucx/lib/$n" ] || [ -f "$dir/ucx/lib/ucx/$n" ] && continue
        echo "$n" | grep -Eq "$base" && continue
        echo "gpu-carry: $(basename "$f") needs $n, which is neither carried nor part of glibc" >&2
        bad=1
    done
done
[ $bad = 0 ] || exit 1
size=$(du -sk "$dir" | awk '{print $1}')
echo "gpu-carry: $dir/ucx: UCX $(sed -n 's/^libucx0=//p' "$dir/ucx/PACKAGES"), $(find "$dir/ucx" -type f | wc -l) files," \
     "$((size / 1024)).$(((size % 1024) * 10 / 1024)) MiB; every NEEDED library is carried or glibc's"
echo "gpu-carry: build with: make UCX_DIR=$dir/ucx ...   (device tool: carry [\"${dir#"$root"/}\"])"

#!/usr/bin/env bash
# tools/install-deps.sh where there is no network (a GPU node): with a package missing (--torch's, where
# python3-torch is not installed) it says why, installs nothing and exits 1 within a few seconds, without
# running apt-get: in a private network namespace (unshare -n: no network at all; needs root, else that
# case is skipped), with apt pointed at a proxy that refuses, and with PDDE_OFFLINE=1. apt runs on scratch
# package lists and only simulates (APT_CONFIG), so the machine's own apt state is never touched.
# Run from the repository root (make test does).
. tests/script_util.sh install-offline
skipped=0
if [ "$(dpkg-query -W -f='${Status}' python3-torch 2>/dev/null)" = "install ok installed" ]; then
    echo "SKIP: python3-torch is installed: install-deps --torch has nothing missing to install"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
conf() { # PROXY: an apt configuration on scratch lists that only simulates
    printf 'Dir::State::Lists "%s/lists";\nDir::Cache "%s/cache";\nAPT::Get::Simulate "true";\n' "$tmp" "$tmp"
    [ -n "$1" ] && printf 'Acquire::http::Proxy "%s";\n' "$1"
}
# offline NAME WHY_PATTERN CMD...: install-deps --torch under CMD: exit 1, WHY said, no apt-get, <= 8 s
offline() {
    local name=$1 why=$2 s rc took
    shift 2
    s=$(date +%s%N)
    timeout 120 "$@" bash tools/install-deps.sh --torch >"$tmp/$name.log" 2>&1
    rc=$?
    took=$((($(date +%s%N) - s) / 1000000))
    echo "$name: exit $rc after $took ms: $(tail -1 "$tmp/$name.log")"
    check "$name: exit 1 (exit $rc; $(tail -1 "$tmp/$name.log"))" "$([ $rc = 1 ] && echo 0 || echo 1)"
    grep -q "install-deps: $why.*not installing the 2 missing package(s)" "$tmp/$name.log"
    check "$name: says '$why' and which packages it leaves out" $?
    ! grep -q 'apt-get update' "$tmp/$name.log"
    check "$name: apt-get update not run" $?
    check "$name: done in ${took} ms (at most 8 s: a 5 s connection attempt and apt-config)" "$([ "$took" -le 8000 ] && echo 0 || echo 1)"
}

conf "" >"$tmp/apt.conf"
if unshare -n true 2>/dev/null; then
    offline no_network "no network: .*(apt's source)" env APT_CONFIG="$tmp/apt.conf" unshare -n
else
    echo "SKIP: unshare -n (a namespace without network) needs root"
    skipped=$((skipped + 1))
fi
# a local port nothing listens on (one the kernel just gave out and took back)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
conf "http://127.0.0.1:$port" >"$tmp/apt-proxy.conf"
offline refused_proxy "no network: 127.0.0.1:$port (apt's proxy)" env APT_CONFIG="$tmp/apt-proxy.conf"
offline pdde_offline "PDDE_OFFLINE=1" env APT_CONFIG="$tmp/apt.conf" PDDE_OFFLINE=1

# nothing missing: nothing to do, whatever the network
bash tools/install-deps.sh --check >/dev/null 2>&1 && {
    PDDE_OFFLINE=1 bash tools/install-deps.sh >"$tmp/none.log" 2>&1
    rc=$?
    check "nothing missing: exit 0 offline ($(tail -1 "$tmp/none.log"))" $rc
}
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]

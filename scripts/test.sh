#!/usr/bin/env bash
# The whole usnet test suite, as CI runs it: installs what it needs (when root),
# checks formatting and lints, runs unit, simulation, model-checking, interop (root)
# and fuzz smoke tests, then the demo and quick benchmarks as end-to-end checks.
# The last line is "usnet: N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp -t usnet-test.XXXXXX)
failed_steps=()
step() {
    local name=$1; shift
    echo "==> $name"
    local t0=$SECONDS
    if "$@" 2>&1 | tee -a "$log"; then :; else failed_steps+=("$name"); fi
    # Each step's time, to see where CI's minutes go.
    times+=("$((SECONDS - t0)) s  $name")
}
times=()

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing test dependencies (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        iproute2 iputils-ping socat util-linux nftables tshark nginx curl python3 hping3 wrk postgresql dnsmasq-base \
        redis-server redis-tools iperf3 openssh-server openssh-client wget openssl haproxy memcached lighttpd vsftpd unbound bind9-dnsutils bird2 squid \
        traceroute iputils-tracepath fping mtr-tiny \
        pkg-config libfontconfig1-dev fonts-dejavu-core bison flex >/dev/null
    # A Go toolchain for usnet-seccomp's test of a Go program, unless one is here.
    if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
        apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    fi
else
    echo "==> not root: skipping apt installs; tests that need root will skip"
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi

step "format" cargo fmt --all -- --check
step "clippy" cargo clippy --workspace --all-targets --release -- -D warnings
# The fuzz targets are a workspace of their own: without this a changed C ABI
# signature surfaces only in the fuzz steps at the end of the run.
step "clippy (fuzz targets)" bash -c "cargo fmt --manifest-path fuzz/Cargo.toml -- --check && cargo clippy --manifest-path fuzz/Cargo.toml --bins --release -- -D warnings"
step "build" cargo build --workspace --release
# --no-fail-fast: one failing test binary must not hide the others (and their count).
step "tests" cargo test --workspace --release --no-fail-fast
# packetdrill's Linux TCP suite against the --so_filename backend: every socket call
# through usnet-posix (the socket layer `usnet run` and libusnet.so use) against a
# stack server on virtual time (IPv4 and IPv6, 2 jobs, a timeout per script); fails
# if a script in the expectations file fails, or if any run hangs or crashes.
# Skipped when ../shared/tools/packetdrill is absent.
step "packetdrill suite" python3 scripts/packetdrill.py --jobs 2 --timeout 60
# The same suite with pool-backed queues (`usnet up --pool-buffers`: a connection's
# payload stays in the packet pool's buffers): the same expectations must hold.
step "packetdrill suite, pool-backed queues" \
    python3 scripts/packetdrill.py --jobs 2 --timeout 60 --flag pool_buffers=1
# Long simulated conversations (100+ MB with loss, 100k connect/close cycles): the
# ignored tests, in the same build as the tests above (selecting packages with -p would
# unify features differently and rebuild them: 3 minutes). shm_throughput is a
# benchmark; robust.rs's helper is a child process of other tests.
step "long simulations" cargo test --workspace --release -- --ignored --skip shm_throughput --skip helper
if [ -d crates/usnet-async-syscall ] && grep -q 'cfg(loom)' crates/usnet-async-syscall/Cargo.toml 2>/dev/null; then
    step "loom model checking" env RUSTFLAGS="--cfg loom" \
        cargo test -p usnet-async-syscall --release --lib --target-dir target/loom loom
fi
# The stack server's arm/kick handshake (usnet-shm::arm) and the ring index
# protocol (usnet-shm::spsc), model-checked.
step "loom model checking (session arm/kick, spsc)" env RUSTFLAGS="--cfg loom" \
    cargo test -p usnet-shm --release --test loom_arm --test loom_spsc --target-dir target/loom
step "demo" ./target/release/usnet demo
step "bench udp (smoke)" ./target/release/usnet bench udp --quick --out target/bench-smoke/udp
step "bench tcp (smoke)" ./target/release/usnet bench tcp --quick --out target/bench-smoke/tcp
step "bench server (smoke)" ./target/release/usnet bench server --quick --sizes 4096,65536 --out target/bench-smoke/server
step "bench nic (smoke)" ./target/release/usnet bench nic --quick --out target/bench-smoke/nic
step "bench async-syscall (smoke)" ./target/release/usnet bench async-syscall --quick --out target/bench-smoke/async-syscall
step "bench prio (smoke)" ./target/release/usnet bench prio --quick --out target/bench-smoke/prio
if [ "$(id -u)" = 0 ]; then
    step "bench preload (smoke)" ./target/release/usnet bench preload --quick --out target/bench-smoke/preload
    step "bench httpd (smoke)" ./target/release/usnet bench httpd --quick --out target/bench-smoke/httpd
    step "bench shards (smoke)" ./target/release/usnet bench shards --quick --lengths 64 --out target/bench-smoke/shards
    step "bench conns (smoke)" ./target/release/usnet bench conns --quick --out target/bench-smoke/conns
    step "bench tcp --wan (smoke)" ./target/release/usnet bench tcp --wan --quick --out target/bench-smoke/tcp-wan
    step "bench soak (2 min)" ./target/release/usnet bench soak --minutes 2 --out target/bench-smoke/soak
fi

if [ "${USNET_FUZZ_SECONDS:-20}" != 0 ]; then
    if ! command -v cargo-fuzz >/dev/null; then
        cargo install --locked cargo-fuzz >/dev/null 2>&1 || echo "cargo-fuzz unavailable: fuzz smoke skipped"
    fi
    if command -v cargo-fuzz >/dev/null; then
        # The committed corpora first, each input once: a regression test.
        # posix_calls's stack server lives across inputs, so LeakSanitizer's scan
        # after each one finds the heap grown and costs more than the inputs (148 s
        # against 44 s for its 4,555): skipped, as its campaigns skip it.
        for t in $(git ls-files fuzz/corpus | cut -d/ -f3 | sort -u); do
            extra=""
            [ "$t" = posix_calls ] && extra="-detect_leaks=0"
            step "fuzz corpus $t" bash -c "set -o pipefail; cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t corpus/$t -- -runs=0 -rss_limit_mb=2048 $extra 2>&1 | tail -2"
        done
        for t in $(cd fuzz && cargo fuzz list 2>/dev/null); do
            step "fuzz $t" bash -c "set -o pipefail; cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t -- -max_total_time=${USNET_FUZZ_SECONDS:-20} -rss_limit_mb=2048 2>&1 | tail -3"
        done
    fi
fi

passed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
ignored=$(grep -Eo '[0-9]+ ignored;' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"
echo "==> time per step (longest first)"
printf '%s\n' "${times[@]}" | sort -rn | head -15
if [ ${#failed_steps[@]} -gt 0 ]; then
    echo "failed steps: ${failed_steps[*]}"
    [ "$failed" = 0 ] && failed=${#failed_steps[@]}
fi
echo "usnet: $passed passed, $failed failed, $ignored skipped"
[ ${#failed_steps[@]} -eq 0 ]

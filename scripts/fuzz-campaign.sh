#!/usr/bin/env bash
# A long fuzzing campaign for one target: scripts/fuzz-campaign.sh TARGET SECONDS [JOBS]
#
# Runs at nice 19 so it can share the machine with editing and building (never with a
# benchmark). New inputs go to fuzz/campaign/TARGET (ignored by git) beside the
# committed corpus, which libFuzzer reads but does not write; the log is
# fuzz/campaign/TARGET.log and the last lines printed are the executions and coverage
# reached, to add up across campaigns.
#
# AddressSanitizer stays on (out-of-bounds reads and writes still stop the run), but
# three of its defaults are turned off for throughput, each measured on `stack_rx`
# (226 executions/s with the defaults, 3,132 without them):
# - quarantine_size_mb=0: freed memory is reused at once instead of after 256 MB of
#   other frees. Every input builds a stack and frees it; with the quarantine each one
#   touched fresh pages (the profile was 40 % page clearing in the kernel). What is
#   given up: catching a use of memory after it was freed, which safe Rust rules out;
#   CI's short runs keep the default and still check the unsafe code for it.
# - detect_stack_use_after_return=0: no fake stack frame for every call.
# - malloc_context_size=0: no backtrace stored at every allocation (a report still has
#   the crashing access's own backtrace).
#
# FUZZ_SANITIZER=none builds the target without AddressSanitizer (into its own
# target directory, so the ASan build stays): 4–9× the executions a second on the
# targets whose inputs drive a whole stack or server (server_session 4,260/s against
# 400–1,500, tcp_established 5,640 against 900–1,100, zc_slots 2,440 against 550–640,
# posix_calls 1,100 against 740). Rust's own checks still stop the run (bounds,
# overflow: cargo fuzz builds with debug assertions and overflow checks; the
# harnesses' asserts); what is given up is catching an out-of-bounds access in
# unsafe code, which is why CI's short runs and the corpus replays keep ASan. ASan
# does not see into the shared-memory mappings the server and clients use in any
# case (it poisons heap and stack, not mmap'd pages).
#
# FUZZ_RUNS=N ends the campaign after N executions if that comes first (for a
# campaign that is to reach a count, not fill a time).
set -euo pipefail
target=${1:?usage: fuzz-campaign.sh TARGET SECONDS [JOBS]}
secs=${2:?usage: fuzz-campaign.sh TARGET SECONDS [JOBS]}
jobs=${3:-1}
cd "$(dirname "$0")/../fuzz"
mkdir -p "campaign/$target" "corpus/$target"
log="campaign/$target.log"
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=0:detect_stack_use_after_return=0:malloc_context_size=0}
args=(-max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1)
if [ -n "${FUZZ_RUNS:-}" ]; then
    args+=(-runs="$FUZZ_RUNS")
fi
if [ "$target" = posix_calls ]; then
    # Its stack server lives across inputs, so after almost every input the heap
    # holds more than before and libFuzzer runs LeakSanitizer's full scan (36 % of
    # the time; 165 executions/s with it, 526 without). A leak is no memory
    # error, and the harness checks what it owns (descriptors, sockets) itself.
    args+=(-detect_leaks=0)
fi
if [ "$jobs" -gt 1 ]; then
    # -fork keeps one corpus for all workers and adds up their executions.
    args+=(-fork="$jobs" -ignore_crashes=0)
fi
build=()
if [ "${FUZZ_SANITIZER:-address}" = none ]; then
    build=(--sanitizer none --target-dir target/sanitizer-none)
fi
echo "== $(date -u +%FT%TZ) $target ${secs}s jobs=$jobs sanitizer=${FUZZ_SANITIZER:-address} ASAN_OPTIONS=$ASAN_OPTIONS" >>"$log"
status=0
nice -n 19 env RUSTC_BOOTSTRAP=1 cargo fuzz run "${build[@]}" "$target" "campaign/$target" "corpus/$target" -- \
    "${args[@]}" >>"$log" 2>&1 || status=$?
grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|^#[0-9]+ +DONE|cov: " "$log" | tail -3
exit "$status"

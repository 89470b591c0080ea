#!/usr/bin/env python3
"""Runs packetdrill's Linux TCP suite (gtests/net/tcp) against usnet's
`--so_filename` backend (usnet-posix, the socket layer of libusnet.so and the
LD_PRELOAD shim, against a stack server in the packetdrill process on virtual
time), the way packetdrill's own run_all.py runs it: its IPv4 and IPv6 flags, each
script from its own directory. The shell commands the scripts run
to tune or probe the Linux kernel (`defaults.sh`, `sysctl`, `ip`, `tc`, `nstat`)
never run: the suite is copied to a temporary directory with every command replaced
by `true`, and the sysctls a script sets become backend flags instead
(`profile=linux` for defaults.sh, then e.g. `tcp_timestamps=0`). Only the file
commands in FILE_COMMANDS (`rm -f` and `dd if=/dev/zero` of a file under /tmp) run
as written, one such script at a time.

Every run has a deadline (--timeout). Prints one line per failure, then
`packetdrill: N passed, N failed` per mode. Exits non-zero when a script listed in the
expectations file fails, or when any run hangs (times out) or crashes (signal).
`--update` appends newly passing scripts to the expectations file (it only grows).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_SUITE = os.path.join(REPO, "..", "shared", "tools", "packetdrill")
DEFAULT_EXPECT = os.path.join(REPO, "crates", "usnet-packetdrill", "suite-passing.txt")

# run_all.py's flags, and the backend flags that give the same addresses.
MODES = {
    "ipv4": (
        "--ip_version=ipv4 --local_ip=192.168.0.1 --gateway_ip=192.168.0.1 "
        "--netmask_ip=255.255.0.0 --remote_ip=192.0.2.1 -D TFO_COOKIE=3021b9d889017eeb "
        "-D CODE=host_unreachable -D CMSG_LEVEL_IP=SOL_IP -D CMSG_TYPE_RECVERR=IP_RECVERR",
        "local=192.168.0.1/16,gateway=192.168.0.2",
    ),
    "ipv6": (
        "--ip_version=ipv6 --mtu=1520 --local_ip=fd3d:0a0b:17d6::1 "
        "--gateway_ip=fd3d:0a0b:17d6:8888::1 --remote_ip=fd3d:fa7b:d17d::1 "
        "-D TFO_COOKIE=c1d1e9742a47a9bc -D CMSG_LEVEL_IP=SOL_IPV6 "
        "-D CMSG_TYPE_RECVERR=IPV6_RECVERR",
        "local6=fd3d:a0b:17d6::1/48,gateway6=fd3d:a0b:17d6:8888::2,mtu=1520",
    ),
}

# The sysctls the backend models (Linux names; see docs/packetdrill.md). Others
# in a script are ignored.
SYSCTLS = {
    "tcp_timestamps", "tcp_sack", "tcp_dsack", "tcp_window_scaling", "tcp_rmem",
    "tcp_wmem", "tcp_syn_retries", "tcp_synack_retries", "tcp_slow_start_after_idle",
    "tcp_early_retrans", "tcp_congestion_control", "tcp_syncookies",
    "tcp_fastopen", "tcp_fastopen_key", "tcp_ecn", "tcp_notsent_lowat",
    "tcp_min_tso_segs", "tcp_retries1", "tcp_mtu_probing", "tcp_base_mss",
    "tcp_mtu_probe_floor", "tcp_probe_threshold", "tcp_probe_interval",
    "tcp_pacing_ss_ratio", "tcp_pacing_ca_ratio",
}

COMMAND = re.compile(r"`([^`]*)`", re.S)
SETTING = re.compile(
    r"(?:net\.ipv4\.|net/ipv4/|/proc/sys/net/ipv4/)([a-z0-9_]+)=(\"[^\"]*\"|'[^']*'|[^\s\\`]+)")
# The fq qdisc on the tunnel: every connection paced (the backend's `default_qdisc`).
FQ = re.compile(r"tc qdisc (?:replace|add) dev \S+ root fq\b")


def settings(text):
    """The modelled sysctls a piece of shell sets, as backend flags, in order."""
    fq = ["default_qdisc=fq"] if FQ.search(text) else []
    return fq + ["%s=%s" % (k, v.strip("\"'")) for k, v in SETTING.findall(text)
                 if k in SYSCTLS and "$" not in v]


EVENT = re.compile(r"^\s*(?:[0-9.]+|\+[0-9.]+|\*)", re.M)


def first_event(text):
    """Offset of the script's first timed event (commands before it are its
    setup)."""
    m = EVENT.search(text)
    return m.start() if m else len(text)


def flags_for(text, defaults):
    """The backend flags a script's setup commands ask for: the Linux profile and
    defaults.sh's own settings when it sources defaults.sh, then each sysctl it sets,
    in order. Commands after the first event are applied when packetdrill runs them
    (see `replacement`). (An in-script `--local_ip` loses to run_all's command line,
    as in packetdrill.)"""
    flags = []
    start = first_event(text)
    # A header `--mss=N`: packetdrill injects TCP packets as GSO frames of N-byte
    # segments, which only the backend can hand the stack as such.
    for m in re.finditer(r"^--mss=([0-9]+)\s*$", text[:start], re.M):
        flags.append("gso_mss=" + m.group(1))
    for m in COMMAND.finditer(text):
        if m.start() > start:
            continue
        cmd = m.group(1)
        if "defaults.sh" in cmd and "profile=linux" not in flags:
            flags.append("profile=linux")
            flags += settings(defaults)
        flags += settings(cmd)
    return flags


# The file commands a script may really run: removing and creating a file of zeroes
# under /tmp (what a script then opens, e.g. for sendfile). Nothing else runs.
FILE_COMMANDS = [
    re.compile(r"(/usr)?(/bin/)?rm -f /tmp/[A-Za-z0-9_.-]+"),
    re.compile(r"(/usr)?(/bin/)?dd( (bs|count)=[0-9]+[kKM]?| status=none| if=/dev/zero"
               r"| of=/tmp/[A-Za-z0-9_.-]+)+"),
]


def file_commands(cmd):
    """The lines of a shell command that are file commands the harness runs."""
    return [l.strip() for l in cmd.splitlines()
            if any(p.fullmatch(l.strip()) for p in FILE_COMMANDS)]


def replacement(text, m):
    """What a shell command becomes: `true`, or for a command after the first event
    that sets modelled sysctls, an append of them to the file the backend reads
    ($USNET_PD_SYSCTL, its `sysctl_file=` flag) before each system call; the file
    commands it holds (FILE_COMMANDS) run as written. Newlines are kept so
    packetdrill's line numbers stay the script's."""
    body = "; ".join(file_commands(m.group(1)) + ["true"])
    if m.start() > first_event(text):
        sets = settings(m.group(1))
        if "tcp_metrics flush" in m.group(1):
            # The backend's own line for it (FLUSH_METRICS in config.rs).
            sets.append("tcp_metrics_flush")
        if sets:
            body += "; printf '%s\\n' >> \"$USNET_PD_SYSCTL\"" % "\\n".join(sets)
    return "`%s%s`" % (body, "\n" * m.group(0).count("\n"))


def prepare(suite, dest):
    """Copies gtests/net to dest with every shell command replaced by `true`; returns
    {relative script path: flags}."""
    src = os.path.join(suite, "gtests", "net")
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("packetdrill"))
    scripts = {}
    with open(os.path.join(src, "common", "defaults.sh"), encoding="utf-8") as fh:
        defaults = fh.read()
    tcp = os.path.join(dest, "tcp")
    for root, _, files in os.walk(tcp):
        for f in files:
            if not f.endswith(".pkt"):
                continue
            p = os.path.join(root, f)
            with open(p, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            scripts[os.path.relpath(p, tcp)] = flags_for(text, defaults)
            if any(file_commands(c) for c in COMMAND.findall(text)):
                WRITES_FILES.add(os.path.relpath(p, tcp))
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(COMMAND.sub(lambda m, t=text: replacement(t, m), text))
    return scripts


def build_packetdrill(suite, out):
    binary = os.path.join(out, "packetdrill")
    if os.path.exists(binary):
        return binary
    subprocess.run(["nice", os.path.join(suite, "build.sh"), out], check=True,
                   stdout=subprocess.DEVNULL)
    return binary


def reason(output):
    """The line that says why a script failed."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    for l in lines:
        if re.search(r"\.pkt:\d+: (error|runtime error)", l) or "error" in l.lower():
            return l[:300]
    return (lines[-1] if lines else "no output")[:300]


# Scripts that run file commands (their runs in both modes write the same files):
# one at a time.
WRITES_FILES = set()
FILE_LOCK = threading.Lock()


def run_one(args, tcp, script, mode, extra):
    if script in WRITES_FILES:
        with FILE_LOCK:
            return run_one_unlocked(args, tcp, script, mode, extra)
    return run_one_unlocked(args, tcp, script, mode, extra)


def run_one_unlocked(args, tcp, script, mode, extra):
    pd_flags, so_flags = MODES[mode]
    fd, sysctl_file = tempfile.mkstemp(prefix="usnet-pd-sysctl.")
    os.close(fd)
    so = ",".join([so_flags] + args.flags +
                  ([] if args.no_sysctls else extra + ["sysctl_file=" + sysctl_file]))
    path = os.path.join(tcp, script)
    cmd = ["timeout", "-k", "5", str(args.timeout), args.packetdrill, "--send_omit_free"]
    cmd += pd_flags.split()
    cmd += ["--so_filename=" + args.so, "--so_flags=" + so, os.path.basename(path)]
    t0 = time.time()
    # The backend's stack server puts its control socket in the run directory; a
    # script that fails ends packetdrill without the backend's free, which would
    # leave the socket behind in /tmp/usnet-UID for every such run.
    run_dir = tempfile.mkdtemp(prefix="usnet-pd-run.")
    env = dict(os.environ, USNET_PD_SYSCTL=sysctl_file, USNET_RUN_DIR=run_dir)
    try:
        p = subprocess.run(cmd, cwd=os.path.dirname(path), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    finally:
        os.unlink(sysctl_file)
        shutil.rmtree(run_dir, ignore_errors=True)
    out = p.stdout.decode("utf-8", "replace")
    if args.show:
        print("==== %s %s\n%s" % (mode, script, out))
    if p.returncode == 0:
        status = "pass"
    elif p.returncode in (124, 137):
        status = "hang"
    elif p.returncode < 0 or p.returncode > 128:
        status = "crash"
    else:
        status = "fail"
    return (mode, script, status, reason(out) if status != "pass" else "", time.time() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=DEFAULT_SUITE, help="packetdrill source tree")
    ap.add_argument("--packetdrill", help="packetdrill binary (default: build it)")
    ap.add_argument("--so", default=os.path.join(REPO, "target", "release",
                                                "libusnet_packetdrill.so"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=60, help="seconds per script")
    ap.add_argument("--expect", default=DEFAULT_EXPECT, help="expectations file")
    ap.add_argument("--update", action="store_true", help="add new passes to --expect")
    ap.add_argument("--results", help="write every result (TSV) here")
    ap.add_argument("--mode", choices=sorted(MODES), action="append")
    ap.add_argument("--show", action="store_true", help="print packetdrill's output")
    ap.add_argument("--flag", dest="flags", action="append", default=[],
                    help="a backend flag for every script (e.g. pool_buffers=1)")
    ap.add_argument("--no-sysctls", action="store_true",
                    help="pass no profile/sysctl flags (for backends without them)")
    ap.add_argument("filter", nargs="*", help="only scripts whose path contains one")
    args = ap.parse_args()

    if not os.path.isdir(os.path.join(args.suite, "gtests", "net", "tcp")):
        print("packetdrill: skipped: no packetdrill source at %s" % args.suite)
        return 0
    if not os.path.exists(args.so):
        print("packetdrill: %s not built (cargo build --release -p usnet-packetdrill)"
              % args.so, file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="usnet-packetdrill.")
    try:
        if not args.packetdrill:
            try:
                args.packetdrill = build_packetdrill(
                    args.suite, os.path.join(REPO, "target", "packetdrill"))
            except (subprocess.CalledProcessError, OSError) as e:
                print("packetdrill: could not build packetdrill from %s (it needs gcc, "
                      "make, bison and flex): %s" % (args.suite, e), file=sys.stderr)
                return 1
        args.packetdrill = os.path.abspath(args.packetdrill)
        scripts = prepare(args.suite, os.path.join(work, "net"))
        tcp = os.path.join(work, "net", "tcp")
        modes = args.mode or ["ipv4", "ipv6"]
        jobs = []
        for script in sorted(scripts):
            if args.filter and not any(f in script for f in args.filter):
                continue
            for mode in modes:
                if (mode == "ipv4" and script.endswith("v6.pkt")) or \
                        (mode == "ipv6" and script.endswith("v4.pkt")):
                    continue
                jobs.append((script, mode))
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            results = list(ex.map(
                lambda j: run_one(args, tcp, j[0], j[1], scripts[j[0]]), jobs))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    expected = set()
    if os.path.exists(args.expect):
        with open(args.expect) as fh:
            expected = {l.strip() for l in fh if l.strip() and not l.startswith("#")}
    bad = []
    for mode, script, status, why, _ in results:
        key = "%s %s" % (mode, script)
        if status != "pass":
            print("%-5s %s %s: %s" % (status, mode, script, why))
        if status in ("hang", "crash") or (status != "pass" and key in expected):
            bad.append((key, status, why))
    if args.results:
        with open(args.results, "w") as fh:
            for mode, script, status, why, secs in results:
                fh.write("%s\t%s\t%s\t%.1f\t%s\n" % (mode, script, status, secs, why))
    for mode in modes:
        r = [x for x in results if x[0] == mode]
        npass = sum(1 for x in r if x[2] == "pass")
        print("packetdrill: %d passed, %d failed (%s)" % (npass, len(r) - npass, mode))
    new = sorted("%s %s" % (m, s) for m, s, st, _, _ in results
                 if st == "pass" and "%s %s" % (m, s) not in expected)
    if new:
        print("newly passing (not yet in %s): %d" % (os.path.relpath(args.expect, REPO),
                                                     len(new)))
        if args.update:
            with open(args.expect, "a") as fh:
                for k in new:
                    fh.write(k + "\n")
    for key, status, why in bad:
        print("REGRESSION %s: %s (%s)" % (key, status, why))
    return 1 if bad else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())

#!/usr/bin/env python3
"""Runs the workspace's built test binaries, several at a time.

`cargo test` runs one test binary after another. Most of ours spend their time waiting on real
clusters, guests, containers and timers, so on this project's 2-core machines the suite took
22 minutes of mostly idle CPU. This runner starts binaries side by side (`--jobs`), the
longest first, keeps each one's output together and prints it when it ends, and says which
failed. Written here rather than taken from cargo-nextest: nextest runs every test in a
process of its own (our binaries share clusters and fixtures between their tests) and would
be compiled from source on every fresh CI machine.

Input: the JSON lines of `cargo test --no-run --message-format=json` on stdin or `--artifacts`.
Arguments after `--` go to every binary (a name filter, `--nocapture`, ...).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib

# Binaries that must run alone. The soak test samples only its own cluster's processes
# (`squadron soak --processes-matching`), so none needs to today.
SOLO = set()

# Binaries that boot guests under software emulation (QEMU's TCG, one busy core per guest):
# two of them side by side on a 2-core machine slowed each other's boots many times over (a
# CI run's Codex guest did not register its agent in 420 s; kvm_network took 266 s, alone
# 48), so no two of them run at once. Each runs beside a binary of the rest instead.
GUESTS = {
    "worker_tasks", "real_providers", "kvm_network", "worker_recovery", "dashboard_browser",
    "egress_injection",
}

# Seconds each long binary took alone (fresh clone, 2026-12-07): the longest start first so
# the last to end is a short one. A binary not named here counts as short.
EXPECTED_S = {
    "worker_tasks": 227,
    "crash": 108,
    "egress_injection": 90,
    "clock": 81,
    "squadron-worker lib": 78,
    "real_providers": 77,
    "soak": 155,
    "deploy_compose": 61,
    "smoke": 53,
    "faults": 49,
    "takeover": 50,
    "kvm_network": 48,
    "worker_recovery": 43,
    "credentials": 43,
    "dashboard_browser": 40,
    "faulty_node": 38,
    "checked_workloads": 34,
    "compare": 26,
    "cluster_replication": 26,
    "agent_canary": 22,
    "agent_providers": 21,
}

# How often a line names the binaries still running (seconds).
PROGRESS_INTERVAL_S = 60
RESULT = re.compile(r"test result: (\w+)\. (\d+) passed; (\d+) failed")
FAILED_TEST = re.compile(r"^test (\S+) \.\.\. FAILED", re.MULTILINE)


class Job:
    def __init__(self, label, argv, cwd, env, key):
        self.label = label
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.key = key
        self.proc = None
        self.out = None
        self.started = 0.0

    @property
    def solo(self):
        return self.key in SOLO

    @property
    def boots_guests(self):
        return self.key in GUESTS

    def may_join(self, running):
        """Whether this job may start beside the jobs `running`."""
        if not running:
            return True
        if self.solo or any(r.solo for r in running):
            return False
        return not (self.boots_guests and any(r.boots_guests for r in running))

    def expected_s(self):
        return EXPECTED_S.get(self.key, 0)


def binaries(lines, args):
    """One job per test executable cargo built."""
    jobs = []
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package_dir = os.path.dirname(msg["manifest_path"])
        name = package_name(msg["manifest_path"])
        kind = target["kind"][0]
        if kind in ("lib", "bin"):
            key = f"{name} {kind}" if kind == "lib" else f"{name} bin {target['name']}"
            source = os.path.relpath(target["src_path"], package_dir)
            label = f"unittests {source} [{name}]"
        else:
            key = target["name"]
            label = os.path.relpath(target["src_path"], package_dir)
        env = dict(os.environ, CARGO_MANIFEST_DIR=package_dir, CARGO_PKG_NAME=name)
        argv = [msg["executable"], *args]
        jobs.append(Job(label, argv, package_dir, env, key))
    return jobs


def package_name(manifest_path):
    with open(manifest_path, "rb") as f:
        return tomllib.load(f)["package"]["name"]


def start(job):
    job.out = tempfile.TemporaryFile()
    job.started = time.monotonic()
    job.proc = subprocess.Popen(
        job.argv, cwd=job.cwd, env=job.env, stdout=job.out, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def finish(job, status, rusage):
    wall = time.monotonic() - job.started
    cpu = rusage.ru_utime + rusage.ru_stime
    job.out.seek(0)
    text = job.out.read().decode("utf-8", "replace")
    job.out.close()
    code = os.waitstatus_to_exitcode(status)
    sys.stdout.write(f"     Running {job.label} ({job.argv[0]})\n{text}")
    sys.stdout.write(
        f"[tests] {job.label}: exit {code}, {wall:.1f} s, {cpu:.1f} s of CPU\n\n"
    )
    sys.stdout.flush()
    return code, text


def run(jobs, parallel):
    # The solo binaries first, each alone; then the rest, longest first.
    waiting = sorted(jobs, key=lambda j: (not j.solo, -j.expected_s()))
    running = {}
    results = []
    last_progress = time.monotonic()
    while waiting or running:
        while len(running) < parallel:
            # The longest waiting job that may join; a solo job waits for the others to end
            # and holds back the rest meanwhile.
            ready = [j for j in waiting if j.may_join(running.values())]
            if not ready or (running and waiting[0].solo):
                break
            job = ready[0]
            waiting.remove(job)
            start(job)
            running[job.proc.pid] = job
        pid, status, rusage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.2)
        elif pid in running:
            job = running.pop(pid)
            code, text = finish(job, status, rusage)
            results.append((job, code, text))
        if running and time.monotonic() - last_progress >= PROGRESS_INTERVAL_S:
            names = ", ".join(
                f"{j.label} ({time.monotonic() - j.started:.0f} s)" for j in running.values()
            )
            print(f"[tests] still running: {names}", flush=True)
            last_progress = time.monotonic()
    return results


def summary(results, elapsed):
    passed = failed = 0
    broken = []
    for job, code, text in results:
        for m in RESULT.finditer(text):
            passed += int(m.group(2))
            failed += int(m.group(3))
        if code != 0:
            names = FAILED_TEST.findall(text) or ["(the binary failed outside a test)"]
            broken.append((job, code, names))
    print(f"[tests] {len(results)} binaries, {passed} tests passed, {failed} failed, "
          f"{elapsed:.0f} s")
    for job, code, names in broken:
        print(f"[tests] FAILED {job.label} (exit {code}): {', '.join(names)}")
    return not broken


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="binaries run at once")
    parser.add_argument("--artifacts", help="cargo's JSON messages (default: stdin)")
    parser.add_argument("--extra", nargs=2, action="append", default=[],
                        metavar=("LABEL", "COMMAND"), help="another command run as a job")
    parser.add_argument("test_args", nargs="*", help="arguments for every test binary")
    opts = parser.parse_args()
    if opts.jobs < 1:
        parser.error("--jobs must be at least 1")
    source = open(opts.artifacts) if opts.artifacts else sys.stdin
    with source:
        jobs = binaries(source, opts.test_args)
    for label, command in opts.extra:
        jobs.append(Job(label, shlex.split(command), os.getcwd(), dict(os.environ), label))
    if not jobs:
        print("[tests] cargo built no test binary", file=sys.stderr)
        return 1
    began = time.monotonic()
    results = run(jobs, opts.jobs)
    return 0 if summary(results, time.monotonic() - began) else 1


if __name__ == "__main__":
    sys.exit(main())

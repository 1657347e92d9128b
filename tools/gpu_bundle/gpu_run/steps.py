"""The run's log lines, the steps' records and the runner that times each command.

A step is one command (a test binary, a benchmark, one attempt of our job). Its record
(rc, seconds, note) is what the summary reads back; rc is 0 on success, the command's exit
status otherwise, 124 after a timeout, -1 when the run's budget left no time for it, -15 when
the run itself was cut off by a signal while it ran. A record with "skipped" true is a step
left out on purpose (its note says why); it does not fail the run.
"""

import json
import os
import signal
import subprocess
import time

# Seconds the budget keeps back for the summary, and the least a step is worth starting with.
SUMMARY_RESERVE_S = 15
MIN_STEP_S = 10
# After a timeout: SIGTERM to the step's process group, SIGKILL after this many seconds.
KILL_GRACE_S = 10
TIMEOUT_RC = 124
BUDGET_RC = -1
CUT_OFF_RC = -15


class CutOff(Exception):
    """The run received SIGTERM or SIGINT: finish with the summary of what ran."""


def raise_cut_off(signum, _frame):
    # Once: the summary that follows must not be interrupted by a second signal.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise CutOff(f"signal {signum}")


class Log:
    """run.sh's lines: each on stdout and appended to run.log, prefixed "run.sh: "."""

    def __init__(self, path):
        self.path = path

    def say(self, line):
        text = f"run.sh: {line}"
        print(text, flush=True)
        with open(self.path, "a") as f:
            f.write(text + "\n")

    @staticmethod
    def echo(text):
        """Stdout alone (command output shown to the reader, not kept in run.log)."""
        if text:
            print(text.rstrip("\n"), flush=True)


class Records:
    """Every step's record in the order run, kept in memory and in steps.json."""

    def __init__(self, path):
        self.path = path
        self.steps = {}

    def record(self, name, rc, seconds, note=None, skipped=False):
        entry = {"ok": rc == 0, "rc": rc, "seconds": int(seconds), "note": note or None}
        if skipped:
            entry.update({"ok": None, "skipped": True})
        self.steps.pop(name, None)
        self.steps[name] = entry
        self._save()

    def rename(self, name, new_name):
        """Keeps a failed attempt under its own name (the next attempt takes `name`)."""
        self.steps[new_name] = self.steps.pop(name)
        self._save()

    def get(self, name):
        return self.steps.get(name)

    def rc(self, name):
        entry = self.steps.get(name)
        return entry["rc"] if entry else None

    def _save(self):
        with open(self.path, "w") as f:
            json.dump(self.steps, f, indent=1)


def tail_lines(path, n):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


class Runner:
    """Runs each step under its timeout, cut to what RUN_BUDGET_S leaves, and records it."""

    def __init__(self, log, records, budget_s, start=None):
        self.log = log
        self.records = records
        self.budget_s = budget_s
        self.start = time.time() if start is None else start

    def elapsed(self):
        return int(time.time() - self.start)

    def cap(self, seconds):
        """The seconds a step may take: `seconds` cut to what the budget leaves (less the
        summary's reserve); 0 when too little is left to start it."""
        left = self.budget_s - self.elapsed() - SUMMARY_RESERVE_S
        return 0 if left < MIN_STEP_S else min(seconds, left)

    def run(self, name, timeout_s, log_path, argv, env=None):
        """Runs argv (stdout and stderr into log_path) with env (default: this process's),
        records the step as `name` and returns its rc."""
        limit = self.cap(timeout_s)
        if limit == 0:
            self.records.record(name, BUDGET_RC, 0,
                                f"not run: the run's budget of {self.budget_s} s is spent")
            self.log.say(f"{name}: not run (RUN_BUDGET_S={self.budget_s} spent)")
            return BUDGET_RC
        t0 = time.time()
        rc, note = self._run(argv, env, log_path, limit, name, t0)
        seconds = time.time() - t0
        self.records.record(name, rc, seconds, note)
        if rc == 0:
            self.log.say(f"{name}: ok ({int(seconds)} s)")
        else:
            why = f"rc={rc}, {note}" if note else f"rc={rc}"
            self.log.say(f"{name}: FAILED {why} (log {log_path}); last lines:")
            self.log.echo("\n".join(tail_lines(log_path, 8)))
        return rc

    def _run(self, argv, env, log_path, limit, name, t0):
        with open(log_path, "w") as out:
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                out.write(f"run.sh: cannot start {argv[0]}: {e}\n")
                return 127, f"cannot start {argv[0]}: {e.strerror}"
            try:
                rc = proc.wait(timeout=limit)
                # A signal's death as the shell reports it (SIGABRT: 134).
                return (128 - rc if rc < 0 else rc), None
            except subprocess.TimeoutExpired:
                stop(proc)
                return TIMEOUT_RC, f"timed out after {limit} s"
            except CutOff as e:
                stop(proc, grace_s=2)
                self.records.record(name, CUT_OFF_RC, time.time() - t0, f"cut off ({e})")
                raise


def stop(proc, grace_s=KILL_GRACE_S):
    """SIGTERM to the step's process group, SIGKILL to what is left after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # The group may outlive its leader: what is left of it gets SIGKILL.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


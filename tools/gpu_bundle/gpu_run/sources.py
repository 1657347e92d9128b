"""What the summary's pieces read: the steps' records, the settings and the files the
steps left in the work directory, and the helpers that read them."""

import json

# The step names of each phase (for "skipped (SKIP)" and "not in --call=N").
STEP_PHASE = {"attention_pytorch": "attention", "ours_attention_tuned": "ours",
              "ours_tuned": "ours", "ours_prefetch": "ours"}


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def last_json(text):
    """The last line of text that parses as a JSON object, or the whole text as JSON."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    try:
        v = json.loads(text)
        return v if isinstance(v, dict) else None
    except ValueError:
        return None


def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Sources:
    """What the pieces read: the run's records and settings, its work directory."""

    def __init__(self, run):
        self.run = run
        self.settings = run.settings
        self.steps = run.records.steps

    def path(self, *parts):
        return self.run.path(*parts)

    def text(self, name):
        return read(self.path(name))

    def ok(self, step):
        return bool((self.steps.get(step) or {}).get("ok"))

    def not_run(self, step):
        """Why a step without a record did not run."""
        phase = STEP_PHASE.get(step, step)
        if phase in self.settings.phases and self.settings.skipped(phase):
            return "skipped (SKIP)"
        if phase not in self.settings.phases:
            return f"not in --call={self.settings.call}"
        return "not run"

    def error(self, step, log):
        """None for a step that passed; else its rc, note and its log's last 3 lines."""
        s = self.steps.get(step)
        if s is None:
            return self.not_run(step)
        if s.get("skipped"):
            return s["note"]
        if s["ok"]:
            return None
        tail = [l.strip()[:300] for l in self.text(log).splitlines() if l.strip()][-3:]
        return "; ".join(x for x in [f"rc={s['rc']}", s["note"]] + tail if x)

    def job_summary(self, name):
        """A job's summary.json (a dict), or None."""
        try:
            j = json.loads(self.text(name))
        except ValueError:
            return None
        return j if isinstance(j, dict) else None


def step_block(src, step, log):
    return {"ok": src.ok(step), "error": src.error(step, log)}

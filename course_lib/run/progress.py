"""Progress sinks for live torchrun jobs: tqdm, an ipywidget, or plain text.

``COURSE_PROGRESS`` picks one (auto, tqdm, widget, text, none). ``auto``
shows a widget inside a Jupyter kernel and tqdm elsewhere. Batch runs
(papermill, nbval) set ``text``: a few stable lines, no widget state saved
into the notebook.
"""

from __future__ import annotations

import json
import os
import sys

from course_lib.core.edition import reword, tr

# Rank 0 prints this prefix followed by JSON; the launcher turns it into progress.
PROGRESS_PREFIX = "@@progress "
# POSIX keeps a pipe write of at most PIPE_BUF (>= 512) bytes in one piece.
_ATOMIC_BYTES = 512


def encode(job: str, done: int, total: int, label: str = "") -> bytes:
    """One progress line, ready for a single ``os.write``.

    The leading newline ends any partial line another process left on the
    shared pipe, so the prefix always starts a line of its own.
    """
    for cut in (None, 64, 0):
        msg = {"job": job[:cut], "done": done, "total": total, "label": label[:cut]}
        line = ("\n" + PROGRESS_PREFIX + json.dumps(msg) + "\n").encode()
        if len(line) <= _ATOMIC_BYTES:
            return line
    raise ValueError("progress line too long")


def emit(job: str, done: int, total: int, label: str = "", fd: int = 1) -> None:
    """Write one progress line atomically; a closed pipe only loses progress."""
    try:
        os.write(fd, encode(job, done, total, label))
    except OSError:
        pass


def split_line(line: str) -> tuple[str, tuple[str, int, int, str] | None]:
    """(text that is not progress, the progress message or None).

    Never raises: garbage, cut or foreign lines are text, and a malformed
    progress message is dropped.
    """
    at = line.find(PROGRESS_PREFIX)
    if at < 0:
        return line, None
    text = line[:at]
    try:
        msg, _ = json.JSONDecoder().raw_decode(line, at + len(PROGRESS_PREFIX))
    except (ValueError, RecursionError):
        return text, None
    if not isinstance(msg, dict):
        return text, None
    job, done, total = msg.get("job"), msg.get("done"), msg.get("total")
    label = msg.get("label", "")
    counts_ok = all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**62
                    for n in (done, total))
    if not (isinstance(job, str) and isinstance(label, str) and counts_ok):
        return text, None
    assert isinstance(done, int) and isinstance(total, int)  # counts_ok
    return text, (job, done, total, label)


# The jobs' names as the learner reads them (``COURSE_EDITION``): the jobs
# send them in English, and the wire and the replays keep them so.
TASKS = ("world size {w}", "uneven microbatches", "capstone at W={w}",
         # a run that names the training it is first: French words them apart
         "train resume (updates {first}-{last})", "train reference (updates {first}-{last})",
         "train ablation:{part} (updates {first}-{last})", "train ablation:{part}",
         "train {run} (updates {first}-{last})", "train {run}", "exercise", "recipes")
RUNS = ("stop", "continuous", "resume", "reference")  # train.py's labels


def task(job: str) -> str:
    """A job's name in the learner's language (the names of code stay)."""
    return reword(job, TASKS, lambda field: reword(field, RUNS))


class Progress:
    def update(self, job: str, done: int, total: int, label: str = "") -> None:
        pass

    def close(self) -> None:
        pass


class TextProgress(Progress):
    """One line when a job starts and one when it finishes."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.current = None

    def update(self, job, done, total, label=""):
        if job != self.current:
            self.current = job
            print(tr("[{job}] started").format(job=task(job)), file=self.stream, flush=True)
        if done >= total:
            print(tr("[{job}] {done}/{total} done").format(job=task(job), done=done,
                                                          total=total),
                  file=self.stream, flush=True)


class TqdmProgress(Progress):
    def __init__(self):
        self.bar = None
        self.job = None

    def update(self, job, done, total, label=""):
        from tqdm.auto import tqdm

        if job != self.job or self.bar is None or self.bar.total != total:
            self.close()
            self.job = job
            self.bar = tqdm(total=total, desc=task(job), leave=False, file=sys.stderr)
        self.bar.n = done
        self.bar.set_postfix_str(label, refresh=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class WidgetProgress(Progress):
    def __init__(self):
        import ipywidgets as w
        from IPython.display import display

        self.bar = w.IntProgress(value=0, min=0, max=1, bar_style="info")
        self.text = w.Label(tr("starting torchrun..."))
        display(w.HBox([self.bar, self.text]))

    def update(self, job, done, total, label=""):
        self.bar.max = max(total, 1)
        self.bar.value = done
        self.text.value = tr("{job}: {done}/{total} {label}").format(
            job=task(job), done=done, total=total, label=label)

    def close(self):
        self.bar.bar_style = "success"


class Recorder(Progress):
    """Passes every update on and keeps it, so a replayed launch (replay.py)
    shows the same progress as the launch it copies."""

    def __init__(self, sink: Progress):
        self.sink = sink
        self.updates: list[list] = []  # [job, done, total, label], as JSON keeps them

    def update(self, job, done, total, label=""):
        self.updates.append([job, done, total, label])
        self.sink.update(job, done, total, label)

    def close(self):
        self.sink.close()


def _in_kernel() -> bool:
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def make(mode: str | None = None, stream=None) -> Progress:
    """``stream``: where text progress goes (default stdout; the CLI passes
    stderr so that its stdout stays machine-readable)."""
    mode = mode or os.environ.get("COURSE_PROGRESS", "auto")
    if mode == "auto":
        mode = "widget" if _in_kernel() else "tqdm"
    if mode == "widget":
        return WidgetProgress()
    if mode == "tqdm":
        return TqdmProgress()
    if mode == "text":
        return TextProgress(stream)
    return Progress()

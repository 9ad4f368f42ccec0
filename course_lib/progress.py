"""Progress sinks for live torchrun jobs: tqdm, an ipywidget, or plain text.

``COURSE_PROGRESS`` picks one (auto, tqdm, widget, text, none). ``auto``
shows a widget inside a Jupyter kernel and tqdm elsewhere. Batch runs
(papermill, nbval) set ``text``: a few stable lines, no widget state saved
into the notebook.
"""

from __future__ import annotations

import os
import sys

# Rank 0 prints this prefix followed by JSON; the launcher turns it into progress.
PROGRESS_PREFIX = "@@progress "


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
            print(f"[{job}] started", file=self.stream, flush=True)
        if done >= total:
            print(f"[{job}] {done}/{total} done", file=self.stream, flush=True)


class TqdmProgress(Progress):
    def __init__(self):
        self.bar = None
        self.job = None

    def update(self, job, done, total, label=""):
        from tqdm.auto import tqdm

        if job != self.job or self.bar is None or self.bar.total != total:
            self.close()
            self.job = job
            self.bar = tqdm(total=total, desc=job, leave=False, file=sys.stderr)
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
        self.text = w.Label("starting torchrun...")
        display(w.HBox([self.bar, self.text]))

    def update(self, job, done, total, label=""):
        self.bar.max = max(total, 1)
        self.bar.value = done
        self.text.value = f"{job}: {done}/{total} {label}"

    def close(self):
        self.bar.bar_style = "success"


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

"""Test-only faults, switched on by ``COURSE_FAULT`` (JSON) or ``fault=``;
the workers' hook: the repository's conftest.py names this module in
``COURSE_WORKER_HOOK``, which ``course_lib.run.hooks.before_update`` imports.

Each fault fires on one step, on one rank or (without "rank") on every rank:
  {"kind": "noise", "step": 2}       the worker prints garbage on stdout and
                                     stderr: binary bytes, cut lines, a line
                                     over 1 MB, fake and malformed progress
  {"kind": "enospc", "rank": 0, "step": 3}
                                     from this step on, every checkpoint file
                                     write stops halfway with ENOSPC
  {"kind": "crash", "rank": 1, "step": 3}
                                     the rank raises at that step
  {"delay": 0.05}                    every rank sleeps this long before each step
  {"kind": "hold", "step": 2, "until": PATH}
                                     the rank waits at that step until PATH
                                     exists (the test's event), 300 s at most
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from course_lib.core import files

NOISE = [
    b"garbage \x00\x01\xff\xfe\x80 binary bytes\n",
    b"a partial line without its newline ",
    b"@@progress {not json\n",
    b'@@progress {"job": 3, "done": "x", "total": null}\n',
    b"@@progress [1, 2, 3]\n",
    b"@@progress " + b"[" * 5000 + b"\n",
    b"\xc3\x28 invalid utf-8, then a 1.5 MB line: " + b"x" * (3 << 19) + b" end\n",
    b"\r\r\n\n",
    b"the last words, with no newline",
]


def _fires(fault: dict, rank: int, step: int) -> bool:
    return fault.get("step") == step and fault.get("rank", rank) == rank


def _noise() -> None:
    for chunk in NOISE:
        for fd in (1, 2):
            try:
                os.write(fd, chunk)
            except OSError:
                pass


def _disk_full_writes() -> None:
    def write_half_then_fail(path, payload: bytes) -> None:
        with open(path, "wb") as f:
            f.write(payload[: len(payload) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    files.write_durably = write_half_then_fail


HOLD_LIMIT = 300.0


def _hold(until: Path) -> None:
    deadline = time.monotonic() + HOLD_LIMIT
    while not until.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"injected hold: {until} never appeared")
        time.sleep(0.02)


def inject(fault: dict, rank: int, step: int) -> None:
    if not _fires(fault, rank, step):
        return
    if fault.get("kind") == "noise":
        _noise()
    elif fault.get("kind") == "enospc":
        _disk_full_writes()
    elif fault.get("kind") == "hold":
        _hold(Path(fault["until"]))


def before_update(fault: dict, rank: int, step: int) -> None:
    """Every fault, at the start of one training update."""
    if fault.get("delay"):
        time.sleep(float(fault["delay"]))
    inject(fault, rank, step)
    if fault.get("kind") == "crash" and _fires(fault, rank, step) and "rank" in fault:
        raise RuntimeError(f"injected fault: rank {rank} crashes at step {step}")

"""Files that a reader (another run, another rank) never sees half-done,
and a block run in another directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def write_atomically(path: Path, payload: bytes) -> Path:
    """Write beside ``path``, then rename over it: all or nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_durably(path: Path, payload: bytes) -> None:
    """Write and fsync, for a file in a staging directory that is renamed
    into place once complete (a checkpoint)."""
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def working_dir(path: Path) -> Iterator[None]:
    """Run the block in ``path``: contextlib.chdir, which Python 3.10 lacks."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)

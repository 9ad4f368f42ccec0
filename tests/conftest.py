import dataclasses
import os
import sys
from pathlib import Path

import pytest

from course_lib import paths, protocol

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COURSE_PROGRESS", "none")


@pytest.fixture(scope="session")
def cfg():
    return protocol.load_config(ROOT / "configs" / "minimum.yaml")


@pytest.fixture(scope="session")
def corpus(cfg):
    return protocol.corpus(cfg)


@pytest.fixture(scope="session")
def data_dir():
    return paths.data_dir()


def with_train(cfg, **changes):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))


def worker_processes(marker: str = "course_lib.worker") -> list[int]:
    """PIDs whose command line runs the course's torchrun worker (or, with
    marker="torch.distributed.run", the torchrun agent) with this checkout's
    interpreter: other checkouts' jobs on the same machine are not ours."""
    ours = sys.executable.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and cmd.startswith(ours) and state != "Z":
            found.append(int(entry))
    return found

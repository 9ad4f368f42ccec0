"""examples/ddp_by_hand.py, the course's rule in plain torch, under a real
torchrun: it passes and fails where the library does, with the library's
numbers (the same N, the same per-rank counts, errors within rounding)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import course_lib
from course_lib.run.placement import free_port
from tests.conftest import ROOT

pytestmark = [pytest.mark.torchrun, pytest.mark.usefixtures("no_worker_left_behind")]

SCRIPT = ROOT / "examples" / "ddp_by_hand.py"
TAKEN = ("address already in use", "EADDRINUSE")  # the free port was taken meanwhile


def _start(numbers: Path) -> subprocess.Popen:
    """The docstring's command, with a free port; its own process group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
           "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(SCRIPT), "--json", str(numbers)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # timed out: the agent and its workers go together
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ours(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (the test's JSON path)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            found.append(int(entry))
    return found


def test_the_script_by_hand_matches_the_library(tmp_path, cfg):
    numbers = tmp_path / "by_hand.json"
    proc = _start(numbers)
    # The library's launch runs meanwhile: the same config, window and world size.
    report = course_lib.parity(cfg, tmp_path / "library", world_size=2, backend="gloo",
                               timeout=300)
    out, err = _finish(proc)
    for _ in range(2):
        if proc.returncode == 0 or not any(t in err for t in TAKEN):
            break
        proc = _start(numbers)
        out, err = _finish(proc)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err[-3000:]}"
    assert re.search(r"^global_token\s+PASS\s+max \|err\| ", out, re.M), out
    assert re.search(r"^mean_of_means\s+FAIL\s+max \|err\| ", out, re.M), out

    mine = json.loads(numbers.read_text())
    assert mine["world_size"] == report.world_size == 2
    assert mine["backend"] == report.backend == "gloo"
    assert mine["global_tokens"] == report.global_tokens == mine["reference_tokens"]
    assert mine["local_tokens"] == report.local_tokens
    assert mine["compared_values"] == report.compared_values
    assert (mine["atol"], mine["rtol"]) == (report.atol, report.rtol)
    assert mine["passed"] and report.passed
    atol = report.atol
    for mode, lib in report.modes.items():
        by_hand = mine["modes"][mode]
        assert by_hand["allclose"] == lib.allclose, mode
        # Two programs, one arithmetic: within float32 rounding of each other.
        assert abs(by_hand["max_abs_err"] - lib.max_abs_err) <= atol, mode
    assert mine["modes"]["global_token"]["max_abs_err"] <= atol
    assert report.correct.max_abs_err <= atol
    assert mine["modes"]["mean_of_means"]["max_abs_err"] > 1e-3

    deadline = time.monotonic() + 5
    while _ours(str(numbers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ours(str(numbers)), "a worker of the script survived it"

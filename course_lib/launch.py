"""Spawn torchrun jobs, stream their progress, and never leave a process behind.

torchrun is the distributed engine; this module only builds its command line,
watches it, and cleans up. torchrun starts each worker in a session of its
own, so stopping a job means signalling every descendant's process group,
not just torchrun's.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from . import progress as progress_mod
from .config import Config
from .jobs import Job, RunFile, run_dir_of
from .progress import PROGRESS_PREFIX


class LaunchError(RuntimeError):
    """A torchrun job failed, timed out or was interrupted.

    The first line of the message names the failed rank and its last step.
    """

    def __init__(self, message: str, *, rank: int | None = None,
                 step: int | None = None, job: str | None = None,
                 log_tail: str = "", interrupted: bool = False):
        super().__init__(message)
        self.rank, self.step, self.job = rank, step, job
        self.log_tail, self.interrupted = log_tail, interrupted


class BackendError(ValueError):
    """The requested backend cannot run here."""


@dataclass(frozen=True)
class Placement:
    backend: str
    device: str
    world_size: int

    @property
    def nccl_reference_path(self) -> bool:
        return self.backend == "nccl" and self.world_size >= 2

    def describe(self) -> str:
        what = f"{self.world_size} rank(s), {self.backend} on {self.device}"
        if self.nccl_reference_path:
            return what + " (the NCCL reference path)"
        return what + " (not the NCCL reference path: a CPU/gloo stand-in)"


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(backend: str = "auto", world_size: int = 2,
            device: str = "auto") -> Placement:
    """auto: NCCL with one GPU per rank when there are >= W GPUs, else gloo/CPU."""
    gpus = gpu_count()
    nccl_ok = dist.is_available() and dist.is_nccl_available()
    if backend == "auto":
        backend = "nccl" if nccl_ok and gpus >= world_size else "gloo"
    if backend == "nccl":
        if not nccl_ok:
            raise BackendError("--backend nccl: this torch build has no NCCL")
        if gpus < world_size:
            raise BackendError(
                f"--backend nccl: needs {world_size} GPUs (one per rank), found {gpus}"
            )
        return Placement("nccl", "cuda", world_size)
    if backend != "gloo":
        raise BackendError(f"--backend: expected auto, gloo or nccl, got {backend!r}")
    if device == "cuda" and gpus == 0:
        raise BackendError("--device cuda: no GPU is visible")
    return Placement("gloo", "cuda" if device == "cuda" else "cpu", world_size)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class MultiNode:
    """Passed through to torchrun; the course never writes its own launcher."""

    nnodes: int
    node_rank: int
    rdzv_endpoint: str
    rdzv_id: str = "course"


def torchrun_command(run_file: Path, nproc_per_node: int,
                     multinode: MultiNode | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0",
           "--monitor-interval", "0.1"]
    if multinode is None:
        cmd += ["--nnodes", "1", "--node-rank", "0",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        cmd += ["--nnodes", str(multinode.nnodes),
                "--node-rank", str(multinode.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", multinode.rdzv_endpoint,
                "--rdzv-id", multinode.rdzv_id]
    return cmd + ["-m", "course_lib.worker", "--run-file", str(run_file)]


# --- process-tree cleanup ----------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM every process group in the job's tree, then SIGKILL survivors."""
    pids = [proc.pid, *descendants(proc.pid)]
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if not any(_alive(p) for p in pids):
                break
            time.sleep(0.05)
    proc.wait()


# --- the launch ----------------------------------------------------------------


@dataclass
class LaunchResult:
    returncode: int
    seconds: float
    placement: Placement
    output: list[str] = field(default_factory=list)


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def launch(cfg: Config, out: Path, jobs: list[Job], *, data_dir: Path,
           world_size: int | None = None, backend: str = "auto",
           device: str = "auto", timeout: float = 600.0,
           progress: progress_mod.Progress | None = None,
           fault: dict | None = None, multinode: MultiNode | None = None,
           collective_timeout: int = 120, echo: bool = False) -> LaunchResult:
    """Run ``jobs`` in one torchrun launch. Raises LaunchError on failure."""
    world_size = world_size or cfg.train.world_size
    cfg = cfg.with_world_size(world_size)
    if fault is None and os.environ.get("COURSE_FAULT"):
        # Test-only switch, e.g. {"kind": "crash", "rank": 1, "step": 3}
        # or {"delay": 0.05} (seconds per step).
        fault = json.loads(os.environ["COURSE_FAULT"])
    placement = resolve(backend, world_size, device)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / "launch.json"
    RunFile(config=cfg.to_dict(), backend=placement.backend, device=placement.device,
            data_dir=str(Path(data_dir).resolve()), out=str(out), jobs=jobs,
            fault=fault, collective_timeout=collective_timeout).write(run_file)
    nnodes = multinode.nnodes if multinode else 1
    if world_size % nnodes:
        raise BackendError(f"world size {world_size} is not a multiple of {nnodes} nodes")
    cmd = torchrun_command(run_file, world_size // nnodes, multinode)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
    sink = progress or progress_mod.make()
    started, tail = time.monotonic(), deque(maxlen=2000)
    wall_start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    failure = None
    try:
        while True:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line.startswith(PROGRESS_PREFIX):
                msg = json.loads(line[len(PROGRESS_PREFIX):])
                sink.update(msg["job"], msg["done"], msg["total"], msg["label"])
            elif line:
                tail.append(line)
                if echo:
                    print(line, file=sys.stderr)
            if time.monotonic() - started > timeout:
                failure = ("timeout", f"timed out after {timeout:.0f} s")
                break
        if failure is None:
            proc.wait()
    except KeyboardInterrupt:
        failure = ("interrupt", "interrupted by the user")
    finally:
        kill_tree(proc)
        sink.close()
    seconds = time.monotonic() - started
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / "torchrun.log").write_text("\n".join(tail) + "\n")
    if failure is None and proc.returncode == 0:
        return LaunchResult(0, seconds, placement, list(tail))
    kind, why = failure or ("error", f"torchrun exited with code {proc.returncode}")
    raise diagnose(out, jobs, wall_start, kind, why, list(tail))


def _run_dirs(out: Path, jobs: list[Job]) -> list[Path]:
    dirs = [out] + [Path(d) for d in map(run_dir_of, jobs) if d]
    return list(dict.fromkeys(dirs))


def _read_logs(dirs: list[Path], since: float) -> dict[int, list[tuple[Path, dict]]]:
    by_rank: dict[int, list[tuple[Path, dict]]] = {}
    for d in dirs:
        for path in (d / "logs").glob("*-rank*.jsonl"):
            rank = int(path.stem.rsplit("rank", 1)[1])
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by SIGKILL
                if rec.get("time", 0) >= since:
                    by_rank.setdefault(rank, []).append((path, rec))
    for recs in by_rank.values():
        recs.sort(key=lambda pr: pr[1]["time"])
    return by_rank


def _last_step(recs: list[tuple[Path, dict]]) -> int | None:
    steps = [r["step"] for _, r in recs if r.get("event") == "step"]
    return steps[-1] if steps else None


def _tail_of(path: Path, n: int = 6) -> str:
    lines = path.read_text().splitlines()[-n:]
    shown = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            shown.append(line)
            continue
        rec.pop("traceback", None)
        shown.append(json.dumps(rec))
    return "\n".join(shown)


def _root_cause_rank(output: list[str]) -> int | None:
    text = "\n".join(output)
    if "Root Cause" not in text:
        return None
    for line in text.split("Root Cause", 1)[1].splitlines():
        if line.strip().startswith("rank"):
            try:
                return int(line.split(":", 1)[1].split()[0])
            except (ValueError, IndexError):
                return None
    return None


PEER_LOST = ("Connection reset by peer", "Connection closed by peer")


def _culprit(rec: dict, errors: list, output: list[str]) -> int | None:
    """The rank at fault when the first error only reports another rank's fate.

    A rank may name the ranks that never finished a step (``stuck``). A rank
    that lost its gloo peer points at the rank torchrun saw die first, when
    that one left no error of its own (a C++ abort on mismatched collectives).
    """
    if rec.get("stuck"):
        return rec["stuck"][0]
    if any(p in rec["message"] for p in PEER_LOST):
        root = _root_cause_rank(output)
        if root is not None and root not in {r for _, r, _, _ in errors}:
            return root
    return None


def diagnose(out: Path, jobs: list[Job], since: float, kind: str, why: str,
             output: list[str]) -> LaunchError:
    """Name the failed rank, its last step and the tail of its log."""
    logs = _read_logs(_run_dirs(out, jobs), since)
    errors = [(rec["time"], rank, path, rec) for rank, recs in logs.items()
              for path, rec in recs if rec.get("event") == "error"]
    progress_line = ", ".join(
        f"rank {r} at step {_last_step(recs)}" for r, recs in sorted(logs.items())
    )
    if errors:
        _, rank, path, rec = min(errors, key=lambda e: e[0])
        same = sorted({r for _, r, _, e in errors if e["message"] == rec["message"]})
        who = (f"ranks {', '.join(map(str, same))}" if len(same) > 1
               else f"rank {rank}")
        step = rec.get("step")
        step = step if step is not None else _last_step(logs.get(rank, []))
        tb = rec.get("traceback", "").strip().splitlines()[-4:]
        tail = _tail_of(path) + ("\n" + "\n".join(tb) if tb else "")
        what, culprit = f"failed in {rec['job']}", _culprit(rec, errors, output)
        if culprit is not None:
            who, what, rank = f"rank {culprit}", what + f" (seen by {who})", culprit
        at = f" at step {step}" if step is not None else ""
        msg = f"{who} {what}{at}: {rec['message']} [{why}]"
        return LaunchError(msg + "\n" + tail, rank=rank, step=step, job=rec["job"],
                           log_tail=tail, interrupted=kind == "interrupt")
    rank = _root_cause_rank(output)
    if rank is None and logs:
        # Nobody reported an error (timeout, interrupt): name the laggard.
        rank = min(logs, key=lambda r: _last_step(logs[r]) or 0)
    step = _last_step(logs.get(rank, [])) if rank is not None else None
    records = logs.get(rank, [])
    paths = [p for p, _ in records]
    tail = "\n".join(filter(None, [_tail_of(paths[-1]) if paths else "",
                                   "--- torchrun output ---", *output[-15:]]))
    who = f"rank {rank}" if rank is not None else "the job"
    where = records[-1][1].get("where") if records else None
    signal_name = _root_cause_signal(output) if kind == "error" else None
    if signal_name:
        why = f"killed by {signal_name}; {why}"
        if signal_name == "SIGABRT":
            why += " (a C++ abort: often collectives that differ between ranks)"
    msg = f"{who} failed" + (f" in {where}" if where else "")
    msg += (f" at step {step}" if step is not None else "") + f": {why}"
    if progress_line:
        msg += f" ({progress_line})"
    return LaunchError(msg + "\n" + tail, rank=rank, step=step, log_tail=tail,
                       interrupted=kind == "interrupt")


def _root_cause_signal(output: list[str]) -> str | None:
    text = "\n".join(output)
    if "Root Cause" not in text:
        return None
    match = re.search(r"\((SIG[A-Z]+)\)", text.split("Root Cause", 1)[1])
    return match.group(1) if match else None

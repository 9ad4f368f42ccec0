"""Spawn torchrun jobs, stream their progress, and never leave a process behind.

torchrun is the distributed engine; this module only builds its command line,
has the agent server fork it (agent.py), watches it, and cleans up. Stopping a
job means signalling every descendant's process group, not just torchrun's: a
worker may live in a group or session of its own.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from . import agent_client, elastic, replay, runlock
from . import data as data_mod
from . import progress as progress_mod
from .config import Config
from .jobs import Job, LaunchRecord, RunFile, TrainJob, run_dir_of, tag
from .prctl import WORKER_NAME


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


WORKER_ENTRY = Path(__file__).with_name("worker_entry.py")


def torchrun_command(run_file: Path, nproc_per_node: int,
                     multinode: MultiNode | None = None,
                     max_restarts: int = 0) -> list[str]:
    """The torchrun command line for this launch: what each node of a
    multi-node job types, and what ``ps`` shows for an agent that the agent
    server forks instead (agent.py). ``max_restarts``: how often torchrun
    restarts all workers after one fails; restarted train jobs resume from
    their newest checkpoint."""
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts),
           "--monitor-interval", "0.1"]
    if multinode is None and max_restarts > 0:
        # A store shared across restarts still holds the dead workers' gloo
        # addresses, so a restarted mesh may dial them. The c10d rendezvous
        # with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see _run) gives every
        # round a fresh store.
        cmd += ["--nnodes", "1", "--node-rank", "0", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-id", f"course-{uuid.uuid4().hex[:12]}"]
    elif multinode is None:
        cmd += ["--nnodes", "1", "--node-rank", "0",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        cmd += ["--nnodes", str(multinode.nnodes),
                "--node-rank", str(multinode.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", multinode.rdzv_endpoint,
                "--rdzv-id", multinode.rdzv_id]
    # Forked from the agent, which has already imported torch and
    # torch._dynamo (agent.py), a worker starts in about 0.3 s instead of 3 s.
    return cmd + ["--start-method", "fork", "--run-path", str(WORKER_ENTRY),
                  "--run-file", str(run_file)]


# --- process-tree cleanup ----------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _groups(pids: list[int]) -> set[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    return groups


def kill_tree(proc: subprocess.Popen | agent_client.Agent, grace: float = 3.0) -> None:
    """SIGTERM every process group in the job's tree, then SIGKILL survivors.

    SIGCONT follows SIGTERM: a stopped (SIGSTOP) process acts on SIGTERM only
    once it runs again.
    """
    pids = [proc.pid, *descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = list(dict.fromkeys(pids + descendants(proc.pid)))
        for group in _groups(pids):
            for s in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
                try:
                    os.killpg(group, s)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if not any(_alive(p) for p in pids):
                break
            time.sleep(0.05)
    proc.wait()


def worker_states(pid: int) -> dict[int, tuple[psutil.Process, str]]:
    """{rank: (process, status)} of the live workers below ``pid``."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for child in children:
        try:
            name, status = child.name(), child.status()
            if name.startswith(WORKER_NAME) and status != psutil.STATUS_ZOMBIE:
                found[int(name[len(WORKER_NAME):])] = (child, status)
        except (psutil.Error, ValueError):
            continue
    return found


def workers(pid: int) -> dict[int, psutil.Process]:
    """{rank: process} of the live workers below ``pid``."""
    return {rank: proc for rank, (proc, _) in worker_states(pid).items()}


def rank_states(proc: subprocess.Popen | agent_client.Agent) -> dict[int, str]:
    """{rank: process status} of the job's live workers ("stopped", ...)."""
    return {rank: status for rank, (_, status) in worker_states(proc.pid).items()}


# --- the launch ----------------------------------------------------------------


@dataclass
class LaunchResult:
    returncode: int
    seconds: float
    placement: Placement
    output: list[str] = field(default_factory=list)
    # One record per torchrun restart: {"restart", "run", "resumed_from_step", ...}
    restarts: list[dict] = field(default_factory=list)


# Longer lines reach the tail in pieces of this many bytes; the tail keeps
# the start of each piece only.
_MAX_PIECE = 64 * 1024
_MAX_SHOWN = 2000


def _reader(stream, lines: queue.Queue) -> None:
    """Bytes in, text lines out: nothing a worker prints can stop this thread."""
    try:
        while True:
            piece = stream.readline(_MAX_PIECE)
            if not piece:
                break
            lines.put(piece.decode("utf-8", errors="replace").rstrip("\r\n"))
    except (OSError, ValueError):
        pass
    finally:
        lines.put(None)


def _shown(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + " [...]"


def _echo(text: str) -> None:
    try:
        print(text, file=sys.stderr)
    except (OSError, UnicodeError):
        pass


def launch(cfg: Config, out: Path, jobs: list[Job], *, data_dir: Path,
           world_size: int | None = None, backend: str = "auto",
           device: str = "auto", timeout: float = 600.0,
           progress: progress_mod.Progress | None = None,
           fault: dict | None = None, multinode: MultiNode | None = None,
           collective_timeout: int = 120, echo: bool = False,
           max_restarts: int = 0) -> LaunchResult:
    """Run ``jobs`` in one torchrun launch. Raises LaunchError on failure.

    The launch holds ``out``'s run lock (runlock.RunDirInUse when another run
    has it) and generates the config's corpus first when it has none.
    """
    world_size = world_size or cfg.train.world_size
    cfg = cfg.with_world_size(world_size)
    if fault is None and os.environ.get("COURSE_FAULT"):
        # Test-only switch, e.g. {"kind": "crash", "rank": 1, "step": 3}
        # or {"delay": 0.05} (seconds per step); more kinds in faults.py.
        fault = json.loads(os.environ["COURSE_FAULT"])
    placement = resolve(backend, world_size, device)
    nnodes = multinode.nnodes if multinode else 1
    if world_size % nnodes:
        raise BackendError(f"world size {world_size} is not a multiple of {nnodes} nodes")
    if max_restarts < 0:
        raise BackendError(f"--max-restarts: must be at least 0, got {max_restarts}")
    out = Path(out).resolve()
    with runlock.hold(out):
        data_dir = data_mod.locate(cfg, Path(data_dir)).resolve()
        data_mod.check_plan(cfg, data_dir, world_size)
        run = RunFile(config=cfg.to_dict(), backend=placement.backend,
                      device=placement.device, data_dir=str(data_dir), out=str(out),
                      jobs=jobs, fault=fault, collective_timeout=collective_timeout)

        def launch_now(sink: progress_mod.Progress | None) -> LaunchResult:
            for attempt in range(PORT_ATTEMPTS):
                try:
                    return _run(run, placement, world_size // nnodes, multinode,
                                max_restarts, timeout, sink, echo)
                except LaunchError as err:
                    # free_port() closes the port before torchrun binds it; a
                    # process in between can take it. No worker has started.
                    if multinode or attempt == PORT_ATTEMPTS - 1 or not _port_taken(err):
                        raise
            raise AssertionError("unreachable")

        store = replay.enabled()
        if store is None or fault or multinode or max_restarts:
            return launch_now(progress)
        started, wall = time.monotonic(), time.time()
        result = replay.run_or_replay(store, run, launch_now,
                                      progress or progress_mod.make(),
                                      lambda: _forget_fresh_runs(jobs))
        if result is not None:
            return result
        seconds = time.monotonic() - started
        (out / "logs").mkdir(exist_ok=True)
        (out / "logs" / "torchrun.log").write_text(
            f"replayed: an identical launch already ran in this session ({replay.ENV})\n")
        LaunchRecord(wall, seconds, world_size, [tag(j) for j in jobs], 0,
                     replayed=True).append_to(out)
        return LaunchResult(0, seconds, placement)


PORT_ATTEMPTS = 3


def _port_taken(err: LaunchError) -> bool:
    return "EADDRINUSE" in str(err) or "Address already in use" in str(err)


def _forget_fresh_runs(jobs: list[Job]) -> None:
    """What a fresh train job's rank 0 does first: drop the run directory's
    old checkpoints, which a replayed launch would otherwise leave beside its own."""
    for job in jobs:
        if isinstance(job, TrainJob) and not job.resume:
            shutil.rmtree(Path(job.run_dir) / "checkpoints", ignore_errors=True)


def _run(run: RunFile, placement: Placement, nproc: int, multinode: MultiNode | None,
         max_restarts: int, timeout: float, progress: progress_mod.Progress | None,
         echo: bool) -> LaunchResult:
    out, jobs = Path(run.out), run.jobs
    run_file = out / "launch.json"
    run.write(run_file)
    elastic.clear(_run_dirs(out, jobs))
    cmd = torchrun_command(run_file, nproc, multinode, max_restarts)
    wall_start = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
           # margin: file mtimes come from a coarser clock than time.time()
           elastic.LAUNCHED_AT: repr(wall_start - 0.5)}
    if max_restarts > 0:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    sink = progress or progress_mod.make()
    started, tail = time.monotonic(), deque(maxlen=2000)
    proc = agent_client.spawn(cmd, env, os.getcwd())
    # The job's time starts with its agent, not with the launcher's first
    # launch starting the agent server.
    deadline = time.monotonic() + timeout
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    failure, states = None, {}
    try:
        while True:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                line = ""
            if line is None:
                break
            text, msg = progress_mod.split_line(line)
            if msg is not None:
                sink.update(*msg)
            if text.strip():
                tail.append(_shown(text))
                if echo:
                    _echo(tail[-1])
            if time.monotonic() > deadline:
                failure = ("timeout", f"timed out after {timeout:.0f} s")
                states = rank_states(proc)
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
    LaunchRecord(wall_start, seconds, nproc * (multinode.nnodes if multinode else 1),
                 [tag(j) for j in jobs], -1 if failure else proc.returncode).append_to(out)
    restarts = elastic.read_restarts(_run_dirs(out, jobs))
    if failure is None and proc.returncode == 0:
        return LaunchResult(0, seconds, placement, list(tail), restarts)
    kind, why = failure or ("error", f"torchrun exited with code {proc.returncode}")
    raise diagnose(out, jobs, wall_start, kind, why, list(tail), states)


def _run_dirs(out: Path, jobs: list[Job]) -> list[Path]:
    dirs = [out] + [Path(d) for d in map(run_dir_of, jobs) if d]
    return list(dict.fromkeys(dirs))


def read_logs(dirs: list[Path], since: float) -> dict[int, list[tuple[Path, dict]]]:
    by_rank: dict[int, list[tuple[Path, dict]]] = {}
    for d in dirs:
        for path in (d / "logs").glob("*-rank*.jsonl"):
            try:
                rank = int(path.stem.rsplit("rank", 1)[1])
                lines = path.read_text(errors="replace").splitlines()
            except (ValueError, OSError):
                continue
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by SIGKILL
                if (isinstance(rec, dict) and isinstance(rec.get("time"), (int, float))
                        and rec["time"] >= since):
                    by_rank.setdefault(rank, []).append((path, rec))
    for recs in by_rank.values():
        recs.sort(key=lambda pr: pr[1]["time"])
    return by_rank


def _last_step(recs: list[tuple[Path, dict]]) -> int | None:
    steps = [r["step"] for _, r in recs if r.get("event") == "step"]
    return steps[-1] if steps else None


def _tail_of(path: Path, n: int = 6) -> str:
    lines = path.read_text(errors="replace").splitlines()[-n:]
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
             output: list[str], states: dict[int, str] | None = None) -> LaunchError:
    """Name the failed rank, its last step and the tail of its log.

    ``states``: the workers' process states when the job timed out; a
    stopped worker is the one that hung the others.
    """
    logs = read_logs(_run_dirs(out, jobs), since)
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
    stopped = sorted(r for r, st in (states or {}).items() if st == psutil.STATUS_STOPPED)
    if stopped:
        rank = stopped[0]
        why += f"; rank {rank}'s process was stopped (SIGSTOP), the others waited for it"
    if rank is None and logs:
        # Nobody reported an error (timeout, interrupt): name the laggard,
        # the rank whose last step came first.
        rank = min(logs, key=lambda r: (_last_step(logs[r]) or 0, logs[r][-1][1]["time"]))
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

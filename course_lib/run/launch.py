"""Spawn torchrun jobs, stream their progress, and never leave a process behind.

torchrun is the distributed engine; this module only builds its command
line, starts it, watches it and cleans up. Two ways to start it, the same
command line and the same tests on both:

- **the fork server** (CPU runs, the default): a warm server that has
  imported torch forks each launch's torchrun agent, and the agent forks
  the workers (``--start-method fork``), so a launch reaches its workers in
  a fraction of a second (``run/forkserver/``);
- **the plain path**: ``subprocess.Popen`` of ``python -m
  torch.distributed.run ... -m course_lib.jobs.worker``, always on NCCL
  (a process forked after CUDA is initialised cannot use it) and whenever
  ``COURSE_FORKSERVER=0``.

``logs/torchrun.log`` starts with the plain command, written as a learner
would type it (``shown``), so it can be copied and run by hand.
"""

from __future__ import annotations

import os
import queue
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.core import data as data_mod
from course_lib.core.config import Config
from course_lib.run import elastic, hooks, processes, runlock
from course_lib.run import progress as progress_mod
from course_lib.run.diagnose import LaunchError, diagnose, run_dirs
from course_lib.run.forkserver import client as forkserver
from course_lib.run.placement import (
    BackendError,
    MultiNode,
    Placement,
    free_port,
    gpu_count,
    resolve,
)
from course_lib.run.runfile import JobSpec, LaunchRecord, RunFile, tag

__all__ = ["BackendError", "LaunchError", "LaunchResult", "MultiNode", "Placement",
           "gpu_count", "launch", "resolve", "shown", "torchrun_command", "uses_forkserver"]

FORKSERVER_ENV = "COURSE_FORKSERVER"
WORKER_MODULE = "course_lib.jobs.worker"
# torchrun's --run-path for workers forked from the agent (the fork server's path).
WORKER_ENTRY = Path(__file__).parents[1] / "jobs" / "worker_entry.py"


def uses_forkserver(backend: str) -> bool:
    """The fork server for CPU backends unless COURSE_FORKSERVER=0; never NCCL."""
    return backend != "nccl" and os.environ.get(FORKSERVER_ENV, "1") != "0"


def torchrun_command(run_file: Path, nproc_per_node: int,
                     multinode: MultiNode | None = None,
                     max_restarts: int = 0, forkserver: bool = True) -> list[str]:
    """The torchrun command line for this launch: what each node of a
    multi-node job types. ``max_restarts``: how often torchrun restarts all
    workers after one fails; restarted train jobs resume from their newest
    checkpoint. ``forkserver``: the agent forks its workers from itself
    (the fork server's agents); else each worker is ``python -m`` of the
    worker module (the plain path)."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if multinode is None:
        cmd += ["--nnodes", "1", "--nproc-per-node", str(nproc_per_node)]
        if max_restarts > 0:
            # A store shared across restarts still holds the dead workers' gloo
            # addresses, so a restarted mesh may dial them. The c10d rendezvous
            # with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see _run) gives every
            # round a fresh store.
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                    "--rdzv-id", f"course-{uuid.uuid4().hex[:12]}"]
        else:  # a free port: 29500 may be taken by another job on this host
            cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        # The same command on every node: the c10d rendezvous numbers the
        # nodes itself (torchrun ignores --node-rank there, with a warning).
        cmd += ["--nnodes", str(multinode.nnodes), "--nproc-per-node", str(nproc_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", multinode.rdzv_endpoint,
                "--rdzv-id", multinode.rdzv_id]
    cmd += ["--max-restarts", str(max_restarts)]
    if forkserver:
        # Forked from the agent, which has already imported torch and
        # torch._dynamo (forkserver/server.py), a worker starts in about
        # 0.3 s instead of 3 s.
        return cmd + ["--start-method", "fork", "--run-path", str(WORKER_ENTRY),
                      "--run-file", str(run_file)]
    return cmd + ["-m", WORKER_MODULE, "--run-file", str(run_file)]


# torchrun's options that take a value: shown as --option=value
_VALUED = {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
           "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--max-restarts",
           "--start-method"}


def shown(cmd: list[str]) -> str:
    """A torchrun command as a learner types it: ``torchrun --nnodes=1 ...``
    (``--max-restarts=0``, torchrun's default, left out)."""
    if cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    words, i = [], 0
    while i < len(cmd):
        if cmd[i] in _VALUED and i + 1 < len(cmd):
            if (cmd[i], cmd[i + 1]) != ("--max-restarts", "0"):
                words.append(f"{cmd[i]}={cmd[i + 1]}")
            i += 2
        else:
            words.append(cmd[i])
            i += 1
    return shlex.join(words)


@dataclass
class LaunchResult:
    returncode: int
    seconds: float
    placement: Placement
    output: list[str] = field(default_factory=list)
    restarts: list[elastic.Restart] = field(default_factory=list)  # one per torchrun restart
    command: str = ""  # the plain torchrun command, as shown()


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


def launch(cfg: Config, out: Path, jobs: list[JobSpec], *, data_dir: Path,
           world_size: int | None = None, backend: str = "auto",
           device: str = "auto", timeout: float = 600.0,
           progress: progress_mod.Progress | None = None,
           fault: dict | None = None, multinode: MultiNode | None = None,
           collective_timeout: int = 120, echo: bool = False,
           max_restarts: int = 0) -> LaunchResult:
    """Run ``jobs`` in one torchrun launch. Raises LaunchError on failure.

    The launch holds ``out``'s run lock (runlock.RunDirInUse when another run
    has it) and generates the config's corpus first when it has none.
    ``echo``: print torchrun's output and its command line as they come.
    """
    cfg = cfg.with_world_size(world_size)
    world_size = cfg.train.world_size
    if fault is None:
        fault = hooks.fault_from_env()
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

        shareable = not (fault or multinode or max_restarts)
        return hooks.around_launch(run, launch_now, progress, shareable)


PORT_ATTEMPTS = 3


def _port_taken(err: LaunchError) -> bool:
    return "EADDRINUSE" in str(err) or "Address already in use" in str(err)


def _run(run: RunFile, placement: Placement, nproc: int, multinode: MultiNode | None,
         max_restarts: int, timeout: float, progress: progress_mod.Progress | None,
         echo: bool) -> LaunchResult:
    out, jobs = Path(run.out), run.jobs
    run_file = out / "launch.json"
    run.write(run_file)
    elastic.clear(run_dirs(out, jobs))
    fork = uses_forkserver(placement.backend)
    cmd = torchrun_command(run_file, nproc, multinode, max_restarts, forkserver=fork)
    # The same launch as a learner would type it (the same port and rendezvous).
    plain = shown(_plain(cmd) if fork else cmd)
    wall_start = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
           # margin: file mtimes come from a coarser clock than time.time()
           elastic.LAUNCHED_AT: repr(wall_start - 0.5)}
    if max_restarts > 0:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    sink = progress or progress_mod.make()
    started, tail = time.monotonic(), deque[str](maxlen=2000)
    if echo:
        _echo(f"$ {plain}")
    preload = tuple(sorted({m for job in jobs for m in job.preload()}))
    proc = forkserver.spawn(cmd, env, os.getcwd(), preload) if fork else _popen(cmd, env)
    # The job's time starts with its agent, not with the launcher's first
    # launch starting the agent server.
    deadline = time.monotonic() + timeout
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    failure: tuple[str, str] | None = None
    states: dict[int, str] = {}
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
                states = processes.rank_states(proc)
                break
        if failure is None:
            proc.wait()
    except KeyboardInterrupt:
        failure = ("interrupt", "interrupted by the user")
    finally:
        processes.kill_tree(proc)
        sink.close()
    seconds = time.monotonic() - started
    (out / "logs").mkdir(exist_ok=True)
    how = "forkserver" if fork else "plain"
    (out / "logs" / "torchrun.log").write_text(
        f"$ {plain}\n# started by the {how} path\n" + "\n".join(tail) + "\n")
    code = -1 if failure or proc.returncode is None else proc.returncode
    LaunchRecord(wall_start, seconds, nproc * (multinode.nnodes if multinode else 1),
                 [tag(j) for j in jobs], code, path=how).append_to(out)
    restarts = elastic.read_restarts(run_dirs(out, jobs))
    if failure is None and proc.returncode == 0:
        return LaunchResult(0, seconds, placement, list(tail), restarts, plain)
    kind, why = failure or ("error", f"torchrun exited with code {proc.returncode}")
    raise diagnose(out, jobs, wall_start, kind, why, list(tail), states)


def _plain(cmd: list[str]) -> list[str]:
    """A fork-server command as the plain path runs it: the worker module
    instead of the forked --run-path entry."""
    i = cmd.index("--start-method")
    return [*cmd[:i], "-m", WORKER_MODULE, *cmd[i + 4:]]


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The plain path: torchrun as a child in a session of its own, which
    dies with this process (its workers die with it in turn)."""
    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            preexec_fn=processes.die_with_parent)

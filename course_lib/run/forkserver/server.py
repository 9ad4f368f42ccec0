"""The agent server: every torchrun agent is a fork of one warm process.

A fresh ``python -m torch.distributed.run`` pays, on 2 CPU cores, 1.7 s to
import torch, and each worker 1.4 s more when DDP's constructor lazily
imports ``torch._dynamo``. So each launching process (a notebook's kernel,
pytest, the CLI) starts one server, ``python -m course_lib.run.forkserver.server FD``, on its
first launch (agent_client.py), and the server imports both once, with the
modules a launch's jobs name (``JobSpec.preload``: a framework's, which cost
each worker seconds more): launches that name other modules get a server of
their own, so a worker never inherits a framework its job does not use. For each
launch it forks an agent: a new session that runs
``torch.distributed.run.main`` with the launch's arguments, environment and
working directory, and that ``ps`` shows as the torchrun command line it
stands for. torchrun forks the workers from it in turn (``--start-method
fork``). An agent leaves with ``os._exit`` once its output is flushed:
finalizing an interpreter that has loaded torch took 0.46 s.

Nothing outlives the launcher: the server leaves when its control socket
closes, and dies with its parent, and every agent dies with the server
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback

import setproctitle
import torch._dynamo  # noqa: F401  (the point: loaded once, before the forks)
from torch.distributed import run

from course_lib.run.forkserver.client import STATUS
from course_lib.run.forkserver.prctl import die_with_parent


def run_torchrun(argv: list[str]) -> int:
    try:
        run.main(argv)
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - torchrun's error report, as python would print it
        traceback.print_exc()
        return 1


def serve(control: socket.socket) -> None:
    """Fork one agent per request until the launcher closes ``control``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
    waiting: dict[int, socket.socket] = {}  # agent PID -> its status socket
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is not control:
                while len(os.read(wake_r, 4096)) == 4096:
                    pass
                _reap(waiting)
                continue
            request, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
            if not request:
                return  # the launcher has gone
            status, out = socket.socket(fileno=fds[0]), fds[1]
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                selector.close()
                for sock in (control, status, *waiting.values()):
                    sock.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                os._exit(_agent(json.loads(request), out, server))
            os.close(out)
            _send(status, pid)
            waiting[pid] = status


def _send(sock: socket.socket, n: int) -> None:
    try:
        sock.send(STATUS.pack(n))
    except OSError:  # the launcher stopped listening
        pass


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock = waiting.pop(pid, None)
        if sock is not None:
            _send(sock, os.waitstatus_to_exitcode(status))
            sock.close()


def _agent(request: dict, out: int, server: int) -> int:
    """In the forked child: become the agent ``request`` describes."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()  # its own process group, which the launcher kills as one
    die_with_parent()
    if os.getppid() != server:  # the server died before the line above
        return 1
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # as `python -m` started there would have it
    cmd = request["cmd"]
    setproctitle.setproctitle(" ".join(cmd))  # before environ changes: it moves environ
    os.environ.clear()
    os.environ.update(request["env"])
    code = run_torchrun(cmd[3:])  # cmd: python -m torch.distributed.run ARGS
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def preload(modules: list[str]) -> None:
    """Import what the workers of this server's launches will import (a
    framework's modules), once, so every fork starts with them. One that
    fails to import is left to the worker, which reports it as its own."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S110 - the worker meets it again and says so
            pass


if __name__ == "__main__":
    preload(sys.argv[2:])
    serve(socket.socket(fileno=int(sys.argv[1])))

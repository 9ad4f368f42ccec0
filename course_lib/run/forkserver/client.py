"""The launcher's side of ``course_lib.run.forkserver.server``: one warm agent server per
launching process, and each launch's torchrun agent forked from it."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import BinaryIO

from course_lib.run.forkserver.prctl import die_with_parent

SERVER_MODULE = "course_lib.run.forkserver.server"
STATUS = struct.Struct("i")  # a PID, then an exit code, on each agent's status socket
# Read by torch's native code while it loads: a server serves only launches
# that agree with the environment it was started with.
_AT_IMPORT = ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL", "PYTHONUNBUFFERED")


class Agent:
    """One forked agent: the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, pid: int, status: socket.socket, stdout: BinaryIO):
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None
        self._status = status

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read(timeout):
            raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout or 0.0)
        assert self.returncode is not None  # _read sets it
        return self.returncode

    def _read(self, timeout: float | None) -> bool:
        self._status.settimeout(timeout)
        try:
            data = self._status.recv(STATUS.size)
        except (BlockingIOError, TimeoutError):
            return False
        except OSError:
            data = b""
        # No status: the server itself was killed, and the agent with it.
        self.returncode = STATUS.unpack(data)[0] if data else -signal.SIGKILL
        self._status.close()
        return True


class _Unreachable(OSError):
    """The request never reached a live server."""


class _Server:
    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()):
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno()), *preload],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.lock = threading.Lock()

    def request(self, cmd: list[str], env: dict[str, str], cwd: str) -> Agent:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        try:
            request = json.dumps({"cmd": cmd, "env": env, "cwd": cwd}).encode()
            with self.lock:
                socket.send_fds(self.control, [request], [theirs.fileno(), write_end])
        except OSError as exc:
            mine.close()
            os.close(read_end)
            raise _Unreachable(exc) from exc
        finally:
            theirs.close()
            os.close(write_end)
        try:
            # A fresh server answers once its preload is imported (a framework's:
            # seconds); a dead one closes the socket at once.
            mine.settimeout(300)
            pid = mine.recv(STATUS.size)
        except OSError:
            pid = b""
        if not pid:
            mine.close()
            os.close(read_end)
            raise OSError(f"the agent server (PID {self.proc.pid}) stopped before "
                          "it started torchrun")
        return Agent(STATUS.unpack(pid)[0], mine, os.fdopen(read_end, "rb"))

    def close(self) -> None:
        self.control.close()  # the server leaves when it reads the end of this
        self.proc.wait()


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(key: tuple, env: dict[str, str], preload: tuple[str, ...],
            fresh: bool = False) -> _Server:
    with _servers_lock:
        server = _servers.get(key)
        if fresh or server is None or server.proc.poll() is not None:
            if server is not None:
                server.close()
            server = _servers[key] = _Server(env, preload)
        return server


def spawn(cmd: list[str], env: dict[str, str], cwd: str,
          preload: tuple[str, ...] = ()) -> Agent:
    """Run ``cmd`` (``python -m torch.distributed.run ARGS``) as a fork of
    this process's agent server, started on first use; the agent's stdout
    and stderr are the returned ``Agent.stdout``. ``preload``: modules the
    workers will import; launches that name the same ones share a server
    that imported them at its start, and the others never see them."""
    key = (os.getpid(), *(env.get(k) for k in _AT_IMPORT), *sorted(preload))
    try:
        return _server(key, env, preload).request(cmd, env, cwd)
    except _Unreachable:  # it died since the last launch: start another, once
        return _server(key, env, preload, fresh=True).request(cmd, env, cwd)

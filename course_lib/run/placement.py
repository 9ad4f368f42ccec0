"""Where a launch runs: the backend, the device and the number of ranks.

``auto`` picks NCCL with one GPU per rank when there are at least W GPUs,
and otherwise gloo with W processes on the CPU. The check of how many GPUs
there are never initialises CUDA in this process (NVML), so the forked
agents and workers can still use it.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

# torch.cuda.is_available() would initialise the driver, and a process
# forked after that cannot use CUDA; NVML answers without it.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


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


# The kernel hands out its ephemeral ports to every outgoing connection (gloo
# opens many), so one it gave us can be taken again before torchrun binds it.
# A port below that range is only ever taken by a process that asks for it.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000


def _below_ephemeral() -> range:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST_PORT, low)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port that is free now, below the kernel's ephemeral range when the
    machine says where that range starts; else one the kernel picks."""
    ports = _below_ephemeral()
    if len(ports) >= 1_000:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.choice(ports)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class MultiNode:
    """Passed through to torchrun; the course never writes its own launcher.
    No node rank: the c10d rendezvous numbers the nodes, so every node runs
    the same command."""

    nnodes: int
    rdzv_endpoint: str
    rdzv_id: str = "course"

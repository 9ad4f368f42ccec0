"""Checkpoints that restore a trajectory, not only weights.

Layout of ``<run>/checkpoints/step-NNNN/``:
  model.pt          model state_dict (rank 0; DDP keeps replicas identical)
  optimizer.pt      optimizer state_dict (SGD momentum buffers)
  trainer.json      step, config, config fingerprint, data lock, world size,
                    sampler state (RNG state, position, history)
  rank-RR.pt        one per rank: rank, Python and torch (and CUDA) RNG states
  manifest.json     sha256 of every file above; written last

A checkpoint is written into ``step-NNNN.tmp``, fsynced, then renamed, so a
killed job leaves either a complete checkpoint or an ignored ``.tmp`` folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from course_lib.core import files
from course_lib.core.config import Config
from course_lib.core.edition import reword
from course_lib.core.typed import decode

MANIFEST = "manifest.json"
TRAINER = "trainer.json"
STEP_DIR = re.compile(r"^step-(\d{4,})$")
ALL_PARTS = frozenset({"model", "optimizer", "sampler", "rng"})


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted or does not fit this run."""

    @property
    def said(self) -> str:
        """The message in the learner's language (``COURSE_EDITION``); the
        message itself stays English, as the CLI, logs and reports keep it."""
        return reword(str(self), MESSAGES, lambda field: reword(field, (DIFFERENCE,)))


# What a CheckpointError says (verify, load, compare_params and the
# evaluation's jobs.evaluate), as ``said`` reads it; the functions write
# their messages themselves, as chapter 06 shows verify.
MESSAGES = (
    "{path}: no such checkpoint directory",
    "{name}: {manifest} is missing (incomplete write?)",
    "{name}/{manifest}: unreadable",
    "{name}/{file}: not listed in the manifest",
    "{name}/{file}: missing",
    "{name}/{file}: sha256 mismatch (edited or truncated)",
    "{name}/{file}: missing from the manifest",
    "{name}: saved with world size {saved}, this run has {world_size}",
    "{name}: data lock {saved} differs from this run's {lock}",
    "{name}: config differs from the checkpoint's ({difference})",
    "{name}/{file}: holds rank {rank}",
    "the two checkpoints hold different parameter names",
    "no valid checkpoint under {out}/checkpoints",
    "{name}: its weights do not fit this config's model ({error})",
)
# The first field of the config that differs (_first_config_difference).
DIFFERENCE = "{field}: {saved} in the checkpoint, {now} now"


@dataclass(frozen=True)
class SamplerState:
    """``WindowSampler.state_dict()``, as ``trainer.json`` holds it."""

    seed: int
    position: int  # windows drawn so far
    rng_state: tuple[int, list[int], float | None]  # random.getstate(), as JSON
    history: list[list[list[list[int]]]]  # window[rank][micro] -> ids, per window


@dataclass(frozen=True)
class Trainer:
    """``trainer.json``: what ``save`` writes beside the weights, as
    ``verify`` and ``load`` return it, typed (``Trainer.of``)."""

    step: int
    world_size: int
    config: dict[str, Any]  # Config.to_dict()
    config_fingerprint: str
    data_lock: str
    sampler: SamplerState
    # The train job's ``meta``: where the checkpoint was written, and by which run.
    backend: str | None = None
    device: str | None = None
    run: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # any other meta

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Trainer:
        """``verify``'s or ``load``'s dict, checked: a missing key or a value
        of the wrong kind is one line naming ``trainer.json`` and the key."""
        return decode(cls, raw, TRAINER)

    @classmethod
    def read(cls, path: Path) -> Trainer:
        """The checkpoint ``path``'s ``trainer.json`` (call ``verify`` first)."""
        return cls.of(json.loads((Path(path) / TRAINER).read_text()))


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:04d}"


def step_of(path: Path) -> int:
    """``.../step-0050`` -> 50; -1 for a name that is not a checkpoint's."""
    m = STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else -1


def rank_file(rank: int) -> str:
    return f"rank-{rank:02d}.pt"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rng_state(device: torch.device) -> dict:
    version, internal, gauss = random.getstate()
    state = {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save(run_dir: Path, step: int, *, model, optimizer, sampler, cfg: Config,
         data_lock: str, rank: int, world_size: int, device: torch.device,
         meta: dict | None = None) -> Path:
    """Collective: every rank calls it at the same step."""
    final = step_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    own = {"rank": rank, "world_size": world_size, "rng": rng_state(device)}
    files.write_durably(tmp / rank_file(rank), _torch_bytes(own))
    _barrier()
    if rank == 0:
        trainer = {
            "step": step,
            "world_size": world_size,
            "config": cfg.to_dict(),
            "config_fingerprint": cfg.protocol_fingerprint(),
            "data_lock": data_lock,
            "sampler": sampler.state_dict(),
            **(meta or {}),
        }
        files.write_durably(tmp / "model.pt", _torch_bytes(model.state_dict()))
        files.write_durably(tmp / "optimizer.pt", _torch_bytes(optimizer.state_dict()))
        files.write_durably(tmp / TRAINER, json.dumps(trainer).encode())
        names = sorted(p.name for p in tmp.iterdir())
        manifest = {
            "format": 1,
            "step": step,
            "world_size": world_size,
            "files": {name: _sha256(tmp / name) for name in names},
        }
        files.write_durably(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        files.fsync_dir(tmp)
        old = final.with_name(final.name + ".old")
        if old.exists():  # left by a save killed before its last line
            shutil.rmtree(old)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        files.fsync_dir(final.parent)
        if old.exists():
            shutil.rmtree(old)
    _barrier()
    return final


def verify(path: Path, *, cfg: Config | None = None, data_lock: str | None = None,
           world_size: int | None = None) -> dict:
    """Check integrity (and, when given, fit). Returns trainer.json's content.

    Every message is one line that names the checkpoint and the problem.
    """
    path = Path(path)
    name = path.name
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{name}: {MANIFEST} is missing (incomplete write?)")
    try:
        manifest = json.loads(manifest_path.read_text())
        expected = manifest["files"]
    except (ValueError, KeyError):
        raise CheckpointError(f"{name}/{MANIFEST}: unreadable") from None
    on_disk = {p.name for p in path.iterdir()} - {MANIFEST}
    extra = sorted(on_disk - set(expected))
    if extra:
        raise CheckpointError(f"{name}/{extra[0]}: not listed in the manifest")
    for file, digest in sorted(expected.items()):
        if not (path / file).is_file():
            raise CheckpointError(f"{name}/{file}: missing")
        if _sha256(path / file) != digest:
            raise CheckpointError(f"{name}/{file}: sha256 mismatch (edited or truncated)")
    for required in ("model.pt", "optimizer.pt", TRAINER):
        if required not in expected:
            raise CheckpointError(f"{name}/{required}: missing from the manifest")
    trainer = json.loads((path / TRAINER).read_text())
    for r in range(trainer["world_size"]):
        if rank_file(r) not in expected:
            raise CheckpointError(f"{name}/{rank_file(r)}: missing from the manifest")
    if world_size is not None and trainer["world_size"] != world_size:
        raise CheckpointError(
            f"{name}: saved with world size {trainer['world_size']}, "
            f"this run has {world_size}"
        )
    if data_lock is not None and trainer["data_lock"] != data_lock:
        raise CheckpointError(
            f"{name}: data lock {trainer['data_lock'][:12]} differs from "
            f"this run's {data_lock[:12]}"
        )
    if cfg is not None and trainer["config_fingerprint"] != cfg.protocol_fingerprint():
        field = _first_config_difference(trainer["config"], cfg.to_dict())
        raise CheckpointError(f"{name}: config differs from the checkpoint's ({field})")
    return trainer


def _first_config_difference(saved: dict[str, Any], current: dict[str, Any],
                             prefix: str = "") -> str:
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        where = f"{prefix}{key}"
        if key in ("stop_at", "checkpoint_every") and prefix == "train.":
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            found = _first_config_difference(a, b, where + ".")
            if found:
                return found
        elif a != b:
            return f"{where}: {a!r} in the checkpoint, {b!r} now"
    return ""


def load(path: Path, *, model, optimizer, sampler, rank: int,
         device: torch.device, parts: Iterable[str] = ALL_PARTS) -> dict:
    """Restore the chosen parts into live objects. Call verify() first."""
    parts = set(parts)
    unknown = parts - ALL_PARTS
    if unknown:
        raise ValueError(f"unknown checkpoint parts: {sorted(unknown)}")
    path = Path(path)
    trainer = json.loads((path / TRAINER).read_text())
    if "model" in parts:
        state = torch.load(path / "model.pt", map_location=device, weights_only=True)
        model.load_state_dict(state)
    if "optimizer" in parts:
        state = torch.load(path / "optimizer.pt", map_location=device,
                           weights_only=True)
        optimizer.load_state_dict(state)
    if "sampler" in parts:
        sampler.load_state_dict(trainer["sampler"])
    if "rng" in parts:
        own = torch.load(path / rank_file(rank), map_location="cpu", weights_only=True)
        if own["rank"] != rank:
            raise CheckpointError(f"{path.name}/{rank_file(rank)}: holds rank {own['rank']}")
        set_rng_state(own["rng"], device)
    return trainer


def load_params(path: Path) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = torch.load(Path(path) / "model.pt",
                                                 map_location="cpu", weights_only=True)
    return params


def compare_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
                   ) -> dict[str, Any]:
    if a.keys() != b.keys():
        raise CheckpointError("the two checkpoints hold different parameter names")
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return {
        "max_abs_param_diff": diff,
        "compared_values": sum(a[k].numel() for k in a),
        "identical": all(torch.equal(a[k], b[k]) for k in a),
    }


def list_checkpoints(root: Path) -> list[Path]:
    """Every step-NNNN folder under ``root``, sorted by run then step
    (never an interrupted write's ``step-NNNN.tmp``)."""
    found = [p for p in Path(root).rglob("step-*")
             if p.is_dir() and p.parent.name == "checkpoints" and STEP_DIR.match(p.name)]
    return sorted(found)


def latest_valid(run_dir: Path, **fit) -> Path | None:
    ckpt_root = Path(run_dir) / "checkpoints"
    found = [p for p in ckpt_root.iterdir() if p.is_dir() and step_of(p) >= 0
             ] if ckpt_root.is_dir() else []
    for p in sorted(found, key=step_of, reverse=True):
        try:
            verify(p, **fit)
            return p
        except CheckpointError:
            continue
    return None

"""The frameworks' own training loops, audited: adapters that feed a real
Hugging Face Trainer, accelerate loop, Lightning Trainer or TRL trainer the
skewed window, under the course's torchrun job, and capture every rank's
gradient just before the optimizer step through the framework's own hooks.

Nothing of a framework is patched: only its data is ours. Each adapter
module imports its framework inside its functions, so the rest of the
course never pays for it. A new framework is one module with an
``ADAPTER`` plus its entry in ``ADAPTERS``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from course_lib.core.reference import flat_grad as reference_flat_grad
from course_lib.frameworks.window import Microbatch, Window, WindowShape


@dataclass(frozen=True)
class Setup:
    """One configuration, as every rank runs it."""

    framework: str
    model: str  # a transformers model_type
    flags: dict[str, Any]
    shape: WindowShape
    workdir: Path  # scratch space for the framework's own outputs
    backend: str
    device: torch.device
    rank: int
    world_size: int
    lr: float = 0.1
    # The configuration on top (``options``): name -> its state.
    uses: dict[str, Any] = field(default_factory=dict)
    # The same window for another (batch size, accumulation): a learner's
    # Trainer decides its own.
    rebuild: Callable[[int, int], Window] | None = None


@dataclass
class Captured:
    grad: torch.Tensor  # this rank's flat gradient, just before the first optimizer step
    seen: list[Microbatch] = field(default_factory=list)  # what the model was fed
    precision: str = "float32"  # what the framework computed in: float32 or bfloat16
    notes: list[str] = field(default_factory=list)  # what else shaped this gradient
    sharded: int = 0  # parameters held as shards (FSDP2's DTensor) at the optimizer step
    compiled: int = 0  # graphs torch.compile (dynamo) compiled while it trained


class Adapter(Protocol):
    package: str  # the distribution pip installs
    modules: tuple[str, ...]  # what prepare imports (preloaded: ``modules``)
    variants: tuple[dict[str, Any], ...]  # the flag sets audited by default

    def supports(self, flags: dict[str, Any]) -> bool:
        """Whether the installed version knows these flags."""
        ...

    def prepare(self, setup: Setup, model: torch.nn.Module, window: Window
                ) -> Callable[[], Captured]:
        """Build the framework's objects (what a bad configuration refuses),
        without any collective; the returned function trains and captures."""
        ...


# name -> module defining ADAPTER
ADAPTERS: dict[str, str] = {
    "hf": "course_lib.frameworks.hf",
    "accelerate": "course_lib.frameworks.accel",
    "lightning": "course_lib.frameworks.lightning_loop",
    "trl": "course_lib.frameworks.trl_sft",
    "unsloth": "course_lib.frameworks.unsloth_sft",
    "trainer": "course_lib.frameworks.own_trainer",  # a learner's: `audit --trainer`
}


class UnknownFramework(ValueError):
    """A --framework that has no adapter, or one that must run alone."""


def exclusive(adapter: Adapter) -> bool:
    """Whether the adapter changes the other frameworks for its whole
    process (Unsloth patches transformers and TRL): it then runs alone, and
    ``load()`` comes before the model is built."""
    return bool(getattr(adapter, "exclusive", False))


def load_first(adapter: Adapter) -> None:
    """An exclusive adapter's imports, before anything builds a model."""
    if exclusive(adapter):
        adapter.load()  # type: ignore[attr-defined]


def modules(frameworks: Iterable[str], models: Iterable[str] = (),
            packages: Iterable[str | None] = ()) -> tuple[str, ...]:
    """The modules the workers of these frameworks, on these transformers
    model types, with these options' packages, will import: what the agent
    server imports once before it forks them (``JobSpec.preload``). () when
    a framework is exclusive: it must come first, in a worker of its own."""
    found: set[str] = set()
    for name in frameworks:
        a = adapter(name)
        if exclusive(a):
            return ()
        found.update(a.modules)
    found.update(f"transformers.models.{m}.modeling_{m}" for m in models)
    found.update(p.replace("-", "_") for p in packages if p)
    return tuple(sorted(found))


def adapter(name: str) -> Adapter:
    if name not in ADAPTERS:
        raise UnknownFramework(f"--framework: unknown framework {name!r} "
                               f"(choose from {', '.join(ADAPTERS)})")
    return importlib.import_module(ADAPTERS[name]).ADAPTER


def installed(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    if importlib.util.find_spec(package.replace("-", "_")) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """One configuration's environment variables, undone after it.

    A framework may configure the next one through ``os.environ``:
    transformers 4.x's ``TrainingArguments(bf16=True)`` sets
    ``ACCELERATE_MIXED_PRECISION=bf16`` and a later ``bf16=False`` leaves it,
    so every later configuration in the process trained in bf16.
    """
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def train_and_capture(model: torch.nn.Module, train: Callable[[], Any],
                      grad: Callable[[], torch.Tensor | None], what: str,
                      precision: str = "float32", notes: Sequence[str] = ()) -> Captured:
    """Run ``train()`` while recording the model's inputs; then the gradient
    ``grad()`` kept at the first optimizer step."""
    seen: list[Microbatch] = []
    hook = record_inputs(model, seen)
    try:
        train()
    finally:
        hook.remove()
    found = grad()
    if found is None:
        raise RuntimeError(f"{what} never reached its optimizer step")
    return Captured(found, seen, precision, list(notes))


def record_inputs(model: torch.nn.Module, seen: list[Microbatch]) -> Any:
    """A forward pre-hook that keeps every training forward's inputs."""
    def keep(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if torch.is_grad_enabled() and "labels" in kwargs:
            ids = kwargs["input_ids"]
            mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
            seen.append(Microbatch(
                ids.detach().cpu().clone(),
                (torch.ones_like(ids) if mask is None else mask).detach().cpu().clone(),
                kwargs["labels"].detach().cpu().clone(),
                positions.detach().cpu().clone() if positions is not None and mask is None
                else None))
    return model.register_forward_pre_hook(keep, with_kwargs=True)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """This rank's gradient as the audit keeps it: flat, float32, on the CPU.
    A sharded gradient (FSDP2's DTensor) is gathered whole first: a
    collective, which every rank reaches at the same optimizer step."""
    if not any(hasattr(p, "full_tensor") for p in model.parameters()):
        return reference_flat_grad(model).detach().float().cpu().clone()
    parts = []
    for p in model.parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        parts.append((g.full_tensor() if hasattr(g, "full_tensor") else g)
                     .detach().float().cpu().flatten())
    return torch.cat(parts)

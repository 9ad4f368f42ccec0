"""The parity job: both built-in modes on the parity window -> reports/parity.json.

``global_token`` (W * S_r / N) must match the single-process reference on
every component; ``mean_of_means``, the negative control, must not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from course_lib import checks
from course_lib.core.config import Config
from course_lib.core.normalize import MODES
from course_lib.core.reference import Comparison
from course_lib.jobs.kind import JobKind, ReportElsewhere, launch
from course_lib.rank import harness
from course_lib.rank.context import RankContext
from course_lib.reports.store import Elsewhere, Report, RunHeader, location_path
from course_lib.run.runfile import JobSpec
from course_lib.steps import BUILTIN


@dataclass(frozen=True)
class ParityJob(JobSpec):
    TAG: ClassVar[str] = "parity"


@dataclass(frozen=True)
class NoSyncProbe:
    ranks_agree_after_micro: list[bool]  # before each later microbatch, then at the end


@dataclass(frozen=True)
class GradSample(Mapping[str, Sequence[float]]):
    """An evenly spaced subset of the gradient's components, for the
    chapter's scatter plot: where each sits in the flattened gradient, its
    reference value, and its value after DDP's sync in each mode.

    Its JSON object has these four keys, and the chapters index it by them
    (``report.grad_sample["reference"]``): it is a read-only mapping too."""

    index: list[int]
    reference: list[float]
    global_token: list[float]
    mean_of_means: list[float]

    def of(self, mode: str) -> list[float]:
        """The sampled components of ``mode`` (one of ``normalize.MODES``)."""
        if mode not in MODES:
            raise KeyError(f"no sampled mode {mode!r}: {', '.join(MODES)}")
        found: list[float] = getattr(self, mode)
        return found

    def __getitem__(self, key: str) -> Sequence[float]:
        if key not in self._keys():
            raise KeyError(key)
        found: Sequence[float] = getattr(self, key)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class ParityReport(RunHeader, Report):
    NAME: ClassVar[str] = "parity"
    compared_values: int
    atol: float
    rtol: float
    step: int
    local_tokens: list[int]
    global_tokens: int
    window_loss_per_token: float
    modes: dict[str, Comparison]
    no_sync: dict[str, NoSyncProbe]
    grad_sample: GradSample
    passed: bool
    control: str
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def correct(self) -> Comparison:
        return self.modes["global_token"]

    @property
    def control_mode(self) -> Comparison:
        return self.modes["mean_of_means"]


def _grad_sample(grads: dict[str, torch.Tensor], ref: torch.Tensor,
                 size: int = 2000) -> GradSample:
    """An evenly spaced subset of components, for the notebook's scatter plot."""
    idx = torch.linspace(0, ref.numel() - 1, min(size, ref.numel())).long()
    return GradSample(index=idx.tolist(), reference=ref[idx].tolist(),
                      **{m: g[idx].tolist() for m, g in grads.items()})


def run_rank(ctx: RankContext, spec: ParityJob) -> None:
    """global_token and mean_of_means on the parity window: parity + no_sync."""
    outcomes = {}
    for i, mode in enumerate(MODES):
        ctx.state.audited = mode
        auditor = checks.Auditor(ctx, BUILTIN[mode])
        auditor.run(checks.select(["parity", "no_sync"]))
        outcomes[mode] = auditor.base()
        ctx.log("mode_done", mode=mode, local_tokens=outcomes[mode].local_tokens,
                agree_after_micro=outcomes[mode].agree_after_micro)
        ctx.progress("parity", i + 1, len(MODES) + 1)
    ctx.state.audited = None
    if ctx.rank == 0:
        ref = harness.parity_reference(ctx)
        atol, rtol = harness.tolerance(ctx.cfg)
        modes = {m: harness.compare_ranks(outcomes[m].grads, ref.grad, atol, rtol)
                 for m in MODES}
        single = ctx.world_size == 1
        ParityReport(
            **ctx.header().fields(),
            compared_values=int(ref.grad.numel()), atol=atol, rtol=rtol,
            step=ctx.cfg.parity.step,
            local_tokens=outcomes["global_token"].local_tokens,
            global_tokens=ref.tokens, window_loss_per_token=ref.loss_per_token,
            modes=modes,
            no_sync={m: NoSyncProbe(outcomes[m].agree_after_micro) for m in MODES},
            grad_sample=_grad_sample({m: o.grads[0] for m, o in outcomes.items()},
                                     ref.grad),
            passed=modes["global_token"].allclose
            and (single or not modes["mean_of_means"].allclose),
            control=("not applicable: with one rank the two modes coincide"
                     if single else "mean_of_means must fail"),
        ).save(ctx.out)
    ctx.progress("parity", len(MODES) + 1, len(MODES) + 1)


KIND = JobKind(ParityJob, run_rank)


def parity(cfg: Config, out: Path, **kw: Any) -> ParityReport:
    """One launch of the parity job; its report, read back."""
    elsewhere = location_path(out)
    elsewhere.unlink(missing_ok=True)
    launch(cfg, out, [ParityJob()], **kw)
    where = Elsewhere.read(out)
    if not ParityReport.exists(out) and where is not None:
        raise ReportElsewhere(f"the parity report is on the node of global rank 0: "
                              f"{where.report(ParityReport.NAME)}")
    return ParityReport.load(out)

"""05 bug lab: the catalog's bugs sorted into families by what each does to
the gradient, and three ways the chapter reads one bug: its row of the
matrix, its body against the rule's, and each layout's error in one check."""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from pathlib import Path

from course_lib.checks.world_size import sequences as world_size_sequences
from course_lib.core.config import Config
from course_lib.core.data import Corpus
from course_lib.jobs.audit import AuditReport, BugsReport
from course_lib.rank import harness
from course_lib.reports.numbers import err_bound
from course_lib.steps import BUILTIN

FAMILIES = {  # the catalog's bugs, by what each does to the gradient
    "tokens weighed unequally": [
        "mean_of_means", "local_count", "per_microbatch_mean"],
    "the right direction, the wrong length": [
        "forgot_world_size", "extra_accumulation_division",
        "first_microbatch_only", "padding_counted", "length_before_shift",
        "count_never_reset"],
    "the right gradient, the wrong communication": [
        "no_sync_backward_only", "join_every_microbatch"],
}

# The course's rule in the catalog's own helpers (BUILTIN["global_token"]
# calls accumulate_window, which does the same): once through backprop_sums,
# once as the loop that backprop_sums runs.
RULE = """
    n = checked_global_count(window_count(microbatches))
    backprop_sums(model, microbatches, lambda s, _: s * (world_size / n))
"""
RULE_LOOP = """
    n = checked_global_count(window_count(microbatches))
    last = len(microbatches) - 1
    for index, (inputs, labels) in enumerate(microbatches):
        with model.no_sync() if index < last else contextlib.nullcontext():
            loss = loss_sum(model(inputs), labels) * (world_size / n)
            loss.backward()
"""


def show_layouts(cfg: Config, corpus: Corpus, window: harness.Layout) -> None:
    """The layouts of the three invariance checks, as the checks build them:
    each microbatch shown by its supervised tokens (16 one-sequence
    microbatches by their total)."""
    def tokens(micro: list[int]) -> int:  # L - 1 targets per sequence
        return sum(len(corpus.sequences[i]) - 1 for i in micro)

    def per_rank(layout: harness.Layout) -> str:
        return "; ".join(f"rank {r}: {[tokens(mb) for mb in rank]}" if len(rank) <= 4
                         else f"rank {r}: {len(rank)} x 1, {sum(map(tokens, rank))}"
                         for r, rank in enumerate(layout))

    print("accumulation_invariance: the parity window, A microbatches x B seqs")
    for name, layout in harness.accumulation_layouts(window).items():
        print(f"  {name:<15} {per_rank(layout)}")
    print("permutation_invariance: the parity window, dealt to other ranks")
    # the check shuffles with the config's seed + 30
    for name, layout in harness.permuted_layouts(window, corpus, cfg.seed + 30).items():
        print(f"  {name:<15} {per_rank(layout)}")
    ids = world_size_sequences(cfg, corpus)
    size = cfg.train.batch_size_per_rank
    print(f"world_size_invariance: {len(ids)} other sequences, microbatches of {size}")
    for w in (1, 2, 4):
        layout = harness.world_size_layout(ids, w, size)
        print(f"  W={w}: {w} rank(s) x {len(layout[0])} microbatch(es),"
              f" tokens per rank {[sum(map(tokens, rank)) for rank in layout]}")


@dataclass(frozen=True)
class Tour:
    bugs: BugsReport  # the catalog's run: every step function through every check
    out: Path  # where that run saved each step's audit

    @property
    def families(self) -> dict[str, list[str]]:
        return FAMILIES

    def row(self, name: str) -> None:
        """The step function's line of the matrix: the checks that fail."""
        print(f"{name}: fails {', '.join(self.bugs.steps[name].caught_by) or 'nothing'}")

    def diff(self, name: str, loop: bool = False) -> None:
        """The bug's body against the rule (``loop``: the rule written as the
        loop it runs), as a unified diff: ``-`` the rule, ``+`` the bug."""
        body = inspect.getsource(BUILTIN[name].func).splitlines()[1:]  # no def line
        rule = (RULE_LOOP if loop else RULE).strip("\n").splitlines()
        lines = difflib.unified_diff(rule, body, "global_token", name, lineterm="", n=1)
        print("\n".join(list(lines)[2:]))  # without the two file-name lines

    def layouts(self, name: str, check: str) -> None:
        """Each layout's max |err| against the check's first layout."""
        c = AuditReport.load(self.out, f"audit-{name}").checks[check]
        shown = ", ".join(  # exactly 0: the first layout against itself
            f"{k}: {'0' if e == 0 else err_bound(e).removeprefix('= ')}"
            for k, e in c.errors.items())
        print(f"{name}, {check} {'PASS' if c.passed else 'FAIL'}: {shown}")


def tour(bugs: BugsReport, out: Path) -> Tour:
    """The chapter's reader of the catalog's run, once FAMILIES is known to
    sort exactly the catalog's bugs (a bug added to it must join a family)."""
    catalog = sorted(n for n, info in BUILTIN.items() if info.kind == "bug")
    sorted_ = sorted(n for names in FAMILIES.values() for n in names)
    if sorted_ != catalog:
        raise ValueError(f"FAMILIES sorts {sorted_}, the catalog's bugs are {catalog}")
    return Tour(bugs, Path(out))

"""05 bug lab: the catalog's bugs sorted into families by what each does to
the gradient, and three ways the chapter reads one bug: its row of the
matrix, its body against the rule's, and each layout's error in one check."""

from __future__ import annotations

import difflib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

from course_lib.checks.base import said
from course_lib.checks.world_size import sequences as world_size_sequences
from course_lib.core.config import Config
from course_lib.core.data import Corpus
from course_lib.core.edition import number, tr
from course_lib.jobs.audit import AuditReport, BugsReport
from course_lib.rank import harness
from course_lib.reports.numbers import err_bound
from course_lib.run import diagnose
from course_lib.steps import BUILTIN

FAMILIES = {  # the catalog's bugs, by what each does to the gradient
    "tokens weighed unequally": [
        "mean_of_means", "local_count", "per_microbatch_mean"],
    "the right direction, the wrong length": [
        "forgot_world_size", "extra_accumulation_division",
        "first_microbatch_only", "padding_counted", "length_before_shift",
        "count_never_reset"],
    "the right arithmetic, the wrong communication": [
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


def _layout(name: str) -> str:
    """A check's layout as the learner reads it: the permutation check's
    (rank/harness.py's permuted_layouts) are words; the others, numbers."""
    if name.startswith("W="):  # world_size_invariance's: W=1, W=2, W=4
        return tr("W={w}").format(w=name.removeprefix("W="))
    return {"as planned": tr("as planned"), "dealt by length": tr("dealt by length"),
            "shuffled": tr("shuffled")}.get(name, name)


def show_layouts(cfg: Config, corpus: Corpus, window: harness.Layout) -> None:
    """The layouts of the three invariance checks, as the checks build them:
    each microbatch shown by its supervised tokens (16 one-sequence
    microbatches by their total)."""
    def tokens(micro: list[int]) -> int:  # L - 1 targets per sequence
        return sum(len(corpus.sequences[i]) - 1 for i in micro)

    def listed(counts: list[int]) -> str:  # counts as the edition writes them
        return "[" + ", ".join(number(n, "d") for n in counts) + "]"

    def per_rank(layout: harness.Layout) -> str:
        rank_of = tr("rank {rank}: {tokens}")
        return tr("; ").join(
            rank_of.format(rank=r, tokens=listed([tokens(mb) for mb in rank])) if len(rank) <= 4
            else rank_of.format(rank=r, tokens=tr("{count} x 1 ({total} tokens)").format(
                count=len(rank), total=number(sum(map(tokens, rank)), "d")))
            for r, rank in enumerate(layout))

    print(tr("accumulation_invariance: the parity window, A microbatches x B seqs"))
    for name, layout in harness.accumulation_layouts(window).items():
        print(f"  {name:<15} {per_rank(layout)}")
    print(tr("permutation_invariance: the parity window, dealt to other ranks"))
    # the check shuffles with the config's seed + 30
    permuted = harness.permuted_layouts(window, corpus, cfg.seed + 30)
    width = max(15, *(len(_layout(name)) for name in permuted))
    for name, layout in permuted.items():
        print(f"  {_layout(name):<{width}} {per_rank(layout)}")
    ids = world_size_sequences(cfg, corpus)
    size = cfg.train.batch_size_per_rank
    print(tr("world_size_invariance: {count} other sequences, microbatches of {size}").format(
        count=len(ids), size=size))
    for w in (1, 2, 4):
        layout = harness.world_size_layout(ids, w, size)
        each = (tr("W={w}: {micro} microbatches per rank, tokens per rank {tokens}")
                if len(layout[0]) > 1 else
                tr("W={w}: 1 microbatch per rank, tokens per rank {tokens}"))
        print("  " + each.format(w=w, micro=len(layout[0]),
                                 tokens=listed([sum(map(tokens, rank)) for rank in layout])))


@dataclass(frozen=True)
class Tour:
    bugs: BugsReport  # the catalog's run: every step function through every check
    out: Path  # where that run saved each step's audit

    @property
    def families(self) -> dict[str, list[str]]:
        return FAMILIES

    def show_families(self) -> None:
        """Each family (in the learner's language) and its step functions."""
        for family, names in FAMILIES.items():
            print(f"{tr(family)}{tr(': ')}{', '.join(names)}")

    def show_why(self, family: int | str) -> None:
        """Why each of the family's bugs is wrong (the catalog's ``why``),
        in the learner's language, wrapped for the page. ``family``: its
        name, or its number from 1, as the chapter numbers them."""
        if not isinstance(family, str):
            family = list(FAMILIES)[family - 1]
        for name in FAMILIES[family]:
            print(textwrap.fill(diagnose.joined(name, tr(BUILTIN[name].why)), 76,
                                subsequent_indent="    "))

    def note(self, name: str, check: str) -> str:
        """The check's note on the step function, as its audit saved it, in
        the learner's language (``said``)."""
        return said(AuditReport.load(self.out, f"audit-{name}").checks[check].note)

    def row(self, name: str) -> None:
        """The step function's line of the matrix: the checks that fail."""
        caught = ", ".join(self.bugs.steps[name].caught_by) or tr("nothing")
        print(tr("{name}: fails {checks}").format(name=name, checks=caught))

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
        # French writes 4,32e-02: its list takes « ; » (the catalog's ", ")
        shown = tr(", ").join(  # exactly 0: the first layout against itself
            f"{_layout(k)}{tr(': ')}{'0' if e == 0 else err_bound(e).removeprefix('= ')}"
            for k, e in c.errors.items())
        verdict = tr("PASS") if c.passed else tr("FAIL")
        print(f"{name}, {check} {verdict}{tr(': ')}{shown}")


def tour(bugs: BugsReport, out: Path) -> Tour:
    """The chapter's reader of the catalog's run, once FAMILIES is known to
    sort exactly the catalog's bugs (a bug added to it must join a family)."""
    catalog = sorted(n for n, info in BUILTIN.items() if info.kind == "bug")
    sorted_ = sorted(n for names in FAMILIES.values() for n in names)
    if sorted_ != catalog:
        raise ValueError(f"FAMILIES sorts {sorted_}, the catalog's bugs are {catalog}")
    return Tour(bugs, Path(out))

"""TRL's real GRPOTrainer under torchrun: the committed table
(``data/trl-grpo-trainer.json``) covers every loss type the installed TRL
offers, its references agree with the course's recipes, and a real 2-rank
run of its default loss type reproduces its committed row."""

import dataclasses

import pytest
import torch

from course_lib.core.verdicts import Verdict
from course_lib.frameworks import installed
from course_lib.frameworks import trl_grpo_trainer as grpo
from course_lib.jobs.trl_grpo import (
    DETAILS,
    INSTALL_FAILED,
    TrainerData,
    describe,
    trl_grpo_trainer,
)

MEASURED = {Verdict.EXACT, Verdict.SCALED, Verdict.BIASED, Verdict.RANKS_DISAGREE}
OTHERS = {"verl", "OpenRLHF"}


@pytest.fixture(scope="module")
def committed():
    return TrainerData.committed()


def test_the_committed_table_covers_every_case_of_the_installed_trl(committed):
    wanted = {(c.trainer, c.loss_type) for c in grpo.cases()}
    rows = {(r.trainer, r.loss_type): r for r in committed.run.rows}
    assert wanted and set(rows) == wanted, "a loss type of the installed TRL is missing"
    assert committed.stack["trl"] == installed("trl"), "measured with another TRL"
    for r in rows.values():
        if r.verdict not in MEASURED:
            assert r.verdict == Verdict.NOT_RUN and r.reason, (r.loss_type, r.verdict)
            continue
        # every rank compared, each fed its own count of completion tokens
        assert [x.rank for x in r.ranks] == [0, 1] and len(r.tokens) == 2
        assert len({sum(t) for t in r.tokens}) == 2, "equal counts cannot show a local one"
        assert len(r.trains) <= 1, f"{r.loss_type}: the objectives do not separate"
        assert (r.claim is None) == (r.claim_verdict is None)
        assert (r.verdict == Verdict.EXACT) == ("token_mean" in r.trains)
    assert {r.framework for r in committed.others} == OTHERS
    assert all(r.verdict == Verdict.NOT_RUN and r.reason for r in committed.others)


def test_the_brief_table_keeps_a_phrase_of_each_reason_and_points_to_the_rest(committed):
    """Chapter 09's table: a not-run row keeps its reason's conclusion on one
    short line and names the file holding the whole of it; every column has
    a legend line."""
    full, brief = describe(committed.rows), describe(committed.rows, brief=True)
    assert DETAILS not in full
    for r in committed.others:
        name = r.trainer or r.framework
        line = next(x for x in brief.splitlines() if x.strip().startswith(name))
        assert DETAILS in line and len(line) < 140, line
        said = " ".join(line.split("not run", 1)[1].rsplit("(in full", 1)[0].split())
        if r.reason.startswith(f"pip install {name} failed"):
            assert said == INSTALL_FAILED, line  # a failed install: no adapter here
        else:
            assert said and said in r.reason, line
    header = brief.splitlines()[0]
    for column in ("vs token mean", "max err", "claim", "vs claim", "trains", "recipe",
                   "tokens per rank"):
        assert column in header and any(x.strip().startswith(column) or f", {column}" in x
                                        for x in brief.splitlines()[1:]), column


def test_the_loss_types_are_the_ones_grpoconfig_documents():
    from trl import GRPOConfig

    found = grpo.loss_types()
    spec = {f.name: f for f in dataclasses.fields(GRPOConfig)}["loss_type"]
    assert spec.default in found  # the default loss type, dapo in 1.16.0
    assert all(f"'{t}'" in spec.metadata["help"] for t in found), found


def _record(seed=0):
    """2 ranks x 2 microbatches of random terms, uneven masks (float64)."""
    g = torch.Generator().manual_seed(seed)
    record = []
    for lengths in (((1, 3), (4, 2)), ((5, 2), (8, 7))):
        rank = []
        for micro in lengths:
            mask = (torch.arange(8)[None] < torch.tensor(micro)[:, None]).double()
            rank.append((torch.randn(len(micro), 8, generator=g, dtype=torch.float64), mask))
        record.append(rank)
    return record


@pytest.mark.parametrize(("loss_type", "objective"), [
    ("dapo", "token_mean"), ("bnpo", "microbatch_means"), ("grpo", "sequence_means"),
    ("dr_grpo", "constant")])
def test_each_reference_is_the_course_recipe_of_its_loss_type(loss_type, objective):
    record = _record()
    want = grpo.recipe_loss(loss_type, record, 8)
    assert torch.allclose(grpo.objective(objective, record, 8), want, rtol=1e-12, atol=0)
    # and no other objective equals it on this uneven record
    others = [n for n in grpo.OBJECTIVES if n != objective
              and torch.allclose(grpo.objective(n, record, 8), want, rtol=1e-6)]
    assert not others, others


@pytest.fixture(scope="module")
def default_run(cfg, tmp_path_factory):
    """TRL's default loss type on 2 ranks: the launch benchmarks/trl_grpo_trainer.py
    --quick makes with the same inputs, so a test session runs it once (the
    replay hook, tests/machinery/replay.py, shares a module fixture's launch)."""
    return trl_grpo_trainer(cfg, tmp_path_factory.mktemp("grpo"), [grpo.default_case()],
                            world_size=2, backend="gloo", device="cpu")


@pytest.mark.torchrun
def test_the_real_trainer_reproduces_the_committed_row_of_its_default(default_run,
                                                                      committed):
    (row,) = default_run.rows
    case = grpo.default_case()
    (want,) = [r for r in committed.run.rows
               if (r.trainer, r.loss_type) == (case.trainer, case.loss_type)]
    assert want.verdict in MEASURED
    assert default_run.world_size == 2 and [x.rank for x in row.ranks] == [0, 1]
    assert len({sum(t) for t in row.tokens}) == 2, row.tokens
    assert (row.verdict, row.claim_verdict, row.trains, row.recipe) == (
        want.verdict, want.claim_verdict, want.trains, want.recipe)
    assert all("not found" not in line for line in default_run.hooked), default_run.hooked


def _describe_before(rows, brief):
    """The table as the English edition printed it before the catalog carried
    it (describe's own f-strings, written out again)."""
    from course_lib.jobs.trl_grpo import LEGEND, _phrase

    def said(r):
        return (f"scaled x{r.factor:.4g}" if r.verdict == Verdict.SCALED and r.factor
                else str(r.verdict))

    lines = [f"  {'trainer':<8} {'loss_type':<9} {'vs token mean':<17} {'max err':>8}  "
             f"{'claim':<16} {'vs claim':<8} {'trains':<16} {'recipe':<7} tokens per rank"]
    for r in rows:
        if r.verdict in (Verdict.NOT_RUN, Verdict.FAILED):
            reason = f"{_phrase(r.reason)} (in full: {DETAILS})" if brief else r.reason
            lines.append(f"  {r.trainer or r.framework:<8} {r.loss_type or '-':<9} "
                         f"{str(r.verdict):<17} {reason}")
            continue
        tokens = " / ".join("+".join(map(str, t)) for t in r.tokens)
        lines.append(
            f"  {r.trainer:<8} {r.loss_type or '-':<9} {said(r):<17} {r.max_err or 0:>8.1e}  "
            f"{r.claim or 'none stated':<16} {str(r.claim_verdict or '-'):<8} "
            f"{', '.join(r.trains) or 'none':<16} {str(r.recipe or '-'):<7} {tokens}")
    return "\n".join(lines + (["", LEGEND] if brief else []))


def test_the_table_speaks_the_edition(committed, monkeypatch):
    """Chapter 09's table: English byte for byte; in French the columns, the
    verdicts (a scale's factor with French marks), the pointer to the whole
    reason and the legend, the columns aligned on the French words; the loss
    types, claims, objectives and reasons as the data has them."""
    import re

    from course_lib.core import edition

    monkeypatch.delenv(edition.ENV, raising=False)
    for brief in (False, True):
        assert describe(committed.rows, brief=brief) == _describe_before(committed.rows, brief)
    monkeypatch.setenv(edition.ENV, "fr")
    french = describe(committed.rows, brief=True).splitlines()
    header = french[0]
    columns = ("face à la moyenne par token", "err. max", "annonce", "face à l'annonce",
               "entraîne", "recette", "tokens par rang")
    for column in columns:  # each column in the header, and in the legend
        assert column in header and any(x.startswith(f"  {column} ") for x in french), column
    rows = french[1:len(committed.rows) + 1]
    measured = [(r, line) for r, line in zip(committed.rows, rows, strict=True)
                if r.verdict in MEASURED]
    assert measured
    for r, line in measured:
        assert line.split()[:2] == [r.trainer, r.loss_type or "-"]
        assert line[header.index("annonce"):].startswith(r.claim or "non déclarée")
        assert re.search(r" \d,\de[-+]\d\d  ", line), line  # max err, French marks
        if r.verdict == Verdict.SCALED:
            assert "échelle ×" in line and not re.search(r"×\d+\.", line), line
    for r, line in zip(committed.rows, rows, strict=True):
        if r.verdict == Verdict.NOT_RUN:
            assert "non exécuté" in line and line.endswith(f"(en entier\u00a0: {DETAILS})")
    ours = [header, *(line for _, line in measured), *french[len(committed.rows) + 2:]]
    assert not [x for x in ours if re.search(r"\b(biased|scaled|none stated|every|against|"
                                              r"completion tokens)\b", x)]

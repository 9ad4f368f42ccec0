"""The frameworks audit's pieces that need no framework: the skewed window,
its counts, and the candidate formulas."""

import os

import pytest
import torch

from course_lib.frameworks import candidates, window
from course_lib.frameworks.window import WindowShape

SHAPE = WindowShape(world_size=2, microbatches=2, batch_size=3, length=24)


def combine(candidate, counts, grads):
    """The candidate's gradient itself: sum_{r,m} c(r, m) g_{r,m}."""
    total = torch.zeros_like(grads[0][0], dtype=torch.float64)
    for r, row in enumerate(grads):
        for m, g in enumerate(row):
            total += candidate.coefficient(counts, r, m) * g.double()
    return total


def best_match(g, counts, grads):
    """The nearest candidate, from the vectors themselves."""
    found = [candidates.Match(c.name, float((g - combine(c, counts, grads)).norm()
                                             / combine(c, counts, grads).norm()))
             for c in candidates.CANDIDATES]
    return min(found, key=lambda m: m.residual)


def judged(g, counts, grads):
    """What the audit names, from inner products only."""
    return candidates.Against.of(candidates.Gram.of(counts, grads), g, grads).best()


@pytest.fixture(scope="module")
def built(corpus):
    return window.build(SHAPE, corpus.source)


def test_the_window_is_skewed_padded_and_partly_masked(built, corpus):
    c = window.counts(built)
    assert len(built) == 2 and all(len(rank) == 2 for rank in built)
    assert c.N_r[0] < c.N_r[1], "short sequences on rank 0"
    assert 0 < c.R < 2 * 2 * 3, "some rows mask their first labels, others do not"
    assert sum(c.N_r) == c.N and sum(map(sum, c.n_before_shift)) == c.N + c.R
    for rank in built:
        for mb in rank:
            assert mb.input_ids.shape == (3, 24)
            pad = mb.input_ids == window.PAD
            assert bool((mb.labels[pad] == -100).all()), "padding is never a token"
            assert bool(((mb.attention_mask == 0) == pad).all())
            assert int(mb.input_ids.max()) < window.vocab_size(corpus.source)
    assert window.build(SHAPE, corpus.source)[1][1].input_ids.equal(built[1][1].input_ids)


def _grads(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(50, generator=g, dtype=torch.float64) for _ in range(2)]
            for _ in range(2)]


@pytest.mark.parametrize("name", [c.name for c in candidates.CANDIDATES])
def test_each_candidate_is_recognised_as_itself(built, name):
    counts = window.counts(built)
    grads = _grads()
    cand = next(c for c in candidates.CANDIDATES if c.name == name)
    g = combine(cand, counts, grads)
    found = best_match(g, counts, grads)
    assert found.name == name and found.residual < 1e-12
    assert judged(g, counts, grads).name == name, "the audit names it from inner products"


def test_a_gradient_that_no_formula_gives_matches_nothing_closely(built):
    counts = window.counts(built)
    found = judged(torch.randn(50, dtype=torch.float64), counts, _grads())
    assert found.residual > 0.1


def newest_measured(matrix, package):
    """The newest version of ``package`` that a measured matrix row ran on."""
    from packaging.version import Version

    found = [Version(r.stack[package]) for r in matrix.measured if package in r.stack]
    return max(found, default=None)


@pytest.mark.parametrize("package", ["transformers", "accelerate", "lightning", "trl"])
def test_the_matrix_covers_the_installed_framework(package):
    """A framework installed here that is newer than every measured row of the
    committed matrix: the course would teach from rows it has not checked."""
    import importlib.metadata

    from packaging.version import Version

    from course_lib.frameworks.evidence import Matrix

    installed = Version(importlib.metadata.version(package))
    newest = newest_measured(Matrix.committed(), package)
    assert newest is not None and installed <= newest, (
        f"{package} {installed} is installed, and the matrix's newest row ran on "
        f"{newest}: run `.venv/bin/python benchmarks/frameworks_matrix.py --add "
        f"{package}=={installed}` and commit data/frameworks-matrix.json")


def test_the_committed_matrix_agrees_with_the_table():
    """data/frameworks-matrix.json (benchmarks/frameworks_matrix.py) against
    frameworks/expected.py: where a run and the reading disagree, the run
    wins and the table is fixed."""
    from packaging.version import Version

    from course_lib.core.verdicts import Verdict
    from course_lib.frameworks.evidence import Matrix
    from course_lib.jobs.frameworks import predicted

    doc = Matrix.committed()
    assert doc.date and doc.torch and doc.command.startswith("python benchmarks/")
    measured = doc.measured
    assert len({r.version for r in measured if r.framework == "hf"}) >= 7
    for r in measured:
        want = predicted(r)
        # transformers 4.46.2 inverted no_sync (#34645): the reading names no
        # formula there, only that the ranks disagree.
        verdict = (Verdict.RANKS_DISAGREE if r.framework == "hf" and Version("4.46.2")
                   <= Version(r.version or "0") < Version("4.46.3") else None)
        where = f"{r.entry} {r.model} {r.flags}"
        assert want is None or r.matches == want, f"{where}: {r.matches} != {want}"
        assert verdict is None or r.verdict == verdict, f"{where}: {r.verdict}"
        assert r.stack.get("torch"), f"{where}: the row names its torch"
    assert any(r.verdict == Verdict.RANKS_DISAGREE for r in measured
               if r.version == "4.46.2"), "the matrix holds the version the rule is about"
    for name, entry in doc.entries.items():
        assert entry.status in ("measured", "not run")
        assert entry.status == "measured" or entry.reason, f"{name}: no reason"


@pytest.mark.parametrize("name", [c.name for c in candidates.CANDIDATES])
def test_inner_products_judge_as_the_gradients_do(built, name):
    """The audit judges from <g, g_i> and <g_i, g_j> alone (GPT-2 small has
    124M components): the same residuals and scales as the vectors give."""
    counts, grads = window.counts(built), _grads(1)
    cand = next(c for c in candidates.CANDIDATES if c.name == name)
    g = 0.9 * combine(cand, counts, grads) + 1e-3 * _grads(2)[0][0]
    seen = candidates.Against.of(candidates.Gram.of(counts, grads), g, grads)
    for other in candidates.CANDIDATES:
        ref = combine(other, counts, grads)
        scale = float(g @ ref) / float(ref @ ref)
        assert seen.scale(other) == pytest.approx(scale, rel=1e-9)
        assert seen.residual(other) == pytest.approx(
            float((g - ref).norm() / ref.norm()), rel=1e-6)
        assert seen.measured(other, 1e-5).residual == pytest.approx(
            float((g - scale * ref).norm() / (abs(scale) * ref.norm())), rel=1e-6, abs=1e-9)
    best, direct = seen.best(), best_match(g, counts, grads)
    assert best.name == direct.name and best.residual == pytest.approx(direct.residual)


def test_one_configuration_leaves_the_environment_as_it_found_it(monkeypatch):
    """transformers 4.x's TrainingArguments(bf16=True) exports
    ACCELERATE_MIXED_PRECISION: without this, every later configuration in
    the job (TRL 0.19.1's bf16=False among them) trained in bf16."""
    from course_lib import frameworks

    monkeypatch.setenv("COURSE_KEPT", "1")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    with pytest.raises(RuntimeError), frameworks.isolated():
        os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16"
        del os.environ["COURSE_KEPT"]
        raise RuntimeError("a framework that fails still gives the environment back")
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ
    assert os.environ["COURSE_KEPT"] == "1"


def test_inner_products_in_blocks_are_the_dot_products():
    """candidates.pairs, a block of columns at a time, against torch.dot in
    float64: among one set of vectors, and across two."""
    torch.manual_seed(0)
    a = [torch.randn(2500) for _ in range(3)]
    b = [torch.randn(2500) for _ in range(2)]
    among = candidates.pairs(a, chunk=1000)
    across = candidates.pairs(a, b, chunk=700)
    for i, x in enumerate(a):
        for j, y in enumerate(a):
            assert among[i, j] == pytest.approx(float(x.double() @ y.double()), rel=1e-12)
        for j, y in enumerate(b):
            assert across[i, j] == pytest.approx(float(x.double() @ y.double()), rel=1e-12)
    assert across.shape == (3, 2) and torch.equal(among, among.T)


def test_every_counting_line_chapter_08_prints_is_in_the_installed_transformers():
    """Chapter 08 prints the installed Trainer's counting lines, found by their
    fragments: a version that moves one must not print 'not found'."""
    from course_lib.frameworks import source

    for wanted in source.TRANSFORMERS:
        line = source.find(wanted)
        assert line is not None or wanted.optional, f"{wanted.formula}: not found"
        if line is not None:
            assert any(f in "\n".join(line.code) for f in wanted.fragments), wanted
    shown = source.describe(source.installed())
    assert "not found in this version" not in shown


def test_every_logging_line_chapter_07_prints_is_in_the_installed_frameworks():
    """Chapter 07 prints the installed frameworks' logging lines, found by
    their fragments: a version that moves one must not print 'not found'."""
    from course_lib.frameworks import source

    shown = source.describe(*source.logging())
    assert "not found in this version" not in shown
    for _, _, wanted in source.LOGGING:
        for w in wanted:
            line = source.find(w)
            assert line is not None and any(f in "\n".join(line.code) for f in w.fragments), w


def test_every_grpo_line_chapter_09_prints_is_in_the_installed_trl():
    """Chapter 09 prints each loss_type's aggregation from the installed TRL,
    found by fragments below the branch's own test: none may be missing, and
    each branch's lines come from its own branch, in the function's order."""
    from course_lib.frameworks import source

    found = source.trl_grpo()
    assert list(found) == ["the token term", "grpo", "dr_grpo", "dapo"]
    assert "not found in this version" not in source.describe(*found.values())
    lines = {name: [int(ln.where.split(" ")[0].rpartition(":")[2]) for ln in s.lines]
             for name, s in found.items()}
    assert lines["grpo"] == sorted(lines["grpo"])
    assert max(lines["grpo"]) < min(lines["dr_grpo"]) < max(lines["dr_grpo"])
    assert max(lines["dr_grpo"]) < min(lines["dapo"][1:])


@pytest.mark.parametrize("model_type, targets", [
    ("llama", {"q_proj", "k_proj", "v_proj", "o_proj"}), ("gpt2", {"c_attn", "c_proj"})])
def test_lora_trains_both_factors_of_the_attention_projections_only(built, corpus,
                                                                    model_type, targets):
    """--with lora: init_lora_weights=False, so B is not zero and A has a
    gradient too; the MLP (GPT-2's mlp.c_proj) and the base weights stay frozen."""
    pytest.importorskip("peft")
    from course_lib.frameworks import models, options
    from course_lib.frameworks.reference import summed_loss

    base = models.build(model_type, window.vocab_size(corpus.source), 0)
    model = options.wrap({"lora": dict(options.LORA.states[0])}, base)
    summed_loss(model, built[0][0]).backward()
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert {n.split(".lora_")[0].rpartition(".")[2] for n in trained} == targets
    assert not any("mlp" in n for n in trained)
    for n, p in trained.items():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, f"{n}: no gradient"


def test_an_unknown_configuration_or_one_no_framework_takes_is_bad_input():
    from course_lib.frameworks import options

    assert options.parse("lora, collator", ["hf"]) == ["lora", "collator"]
    with pytest.raises(options.UnknownOption, match="unknown configuration 'nope'"):
        options.parse("nope", ["hf"])
    with pytest.raises(options.UnknownOption, match="applies to hf"):
        options.parse("collator", ["trl", "accelerate"])

"""The evaluation: per-sequence scores that add up the same whatever the
split, DistributedSampler's padding, and ``course-lib evaluate`` on one
process and on W ranks, against the single-process evaluation."""

import dataclasses

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.core import checkpoint as ck
from course_lib.core import data
from course_lib.core.evaluate import RTOL, Score, evaluate, score, shard
from course_lib.core.model import build_model
from course_lib.jobs.evaluate import EvaluationReport

from .conftest import course_lib_cli


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 9))
def test_shard_is_distributed_samplers_with_its_repeats_marked(n, world):
    seen: list[int] = []
    sizes = set()
    for rank in range(world):
        positions, repeat = shard(n, world, rank)
        sizes.add(len(positions))
        seen += [p for p, r in zip(positions, repeat.tolist()) if not r]
        # a repeat is one of the first entries, handed out again
        assert all(p < (-n) % world for p, r in zip(positions, repeat.tolist()) if r)
    assert sizes == {-(-n // world)}, "every rank runs the same number of samples"
    assert sorted(seen) == list(range(n)), "without the repeats: each sequence once"


def test_scores_add_up_the_same_whatever_the_batches(cfg, corpus):
    model = build_model(cfg)
    ids = list(corpus.splits["test"][:40])
    whole = score(model, corpus, ids, batch_size=64).totals()
    parts = [score(model, corpus, ids[i::3], batch_size=5).totals() for i in range(3)]
    assert torch.allclose(torch.stack(parts).sum(0), whole, rtol=RTOL, atol=0.0)
    assert int(whole[1]) == sum(len(corpus.sequences[i]) - 1 for i in ids)


def test_single_process_evaluation_is_the_token_mean(cfg, corpus):
    model = build_model(cfg)
    e = evaluate(model, corpus)
    s = score(model, corpus, corpus.splits["test"])
    assert e["tokens"] == int(s.tokens.sum())
    assert e["loss_per_token"] == pytest.approx(float(s.loss.sum()) / e["tokens"], rel=1e-15)
    # not the mean of the sequences' own means
    per_sequence = (s.loss / s.tokens).mean().item()
    assert abs(per_sequence - e["loss_per_token"]) > 1e-4


@pytest.fixture()
def saved(tmp_path, cfg, corpus):
    """A checkpoint of the initial model, written in this process."""
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = data.make_sampler(cfg, corpus, 2)
    return ck.save(tmp_path / "elsewhere", 3, model=model, optimizer=opt, sampler=sampler,
                   cfg=cfg.with_world_size(1), data_lock=corpus.lock, rank=0, world_size=1,
                   device=torch.device("cpu"))


def test_a_checkpoint_outside_out_is_evaluated_and_named_in_full(saved, tmp_path):
    out = tmp_path / "run"
    r = course_lib_cli("evaluate", "--out", out, "--checkpoint", saved)
    # the initial weights are no better than themselves
    assert r.returncode == 1, r.stderr
    assert "no better than the untrained" in r.stderr
    e = EvaluationReport.load(out)
    assert e.checkpoint == str(saved.resolve())
    assert (e.step, e.world_size, e.distributed) == (3, 1, None)
    assert e.loss_per_token == e.untrained.loss_per_token


def test_evaluate_refuses_bad_checkpoints_in_one_line(saved, tmp_path, cfg):
    r = course_lib_cli("evaluate", "--out", tmp_path, "--checkpoint", tmp_path / "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no such checkpoint directory" in r.stderr
    r = course_lib_cli("evaluate", "--out", tmp_path / "empty")
    assert r.returncode == 2 and "no valid checkpoint under" in r.stderr
    # weights of another model: the same corpus, a wider model
    wider = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_model=48))
    path = tmp_path / "wider.yaml"
    path.write_text(yaml.safe_dump(wider.to_dict()))
    r = course_lib_cli("evaluate", "--config", path, "--out", tmp_path, "--checkpoint", saved)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "do not fit this config's model" in r.stderr


@pytest.mark.torchrun
@pytest.mark.usefixtures("no_worker_left_behind")
def test_evaluate_on_three_ranks_equals_one_process(saved, tmp_path):
    """3 does not divide the 256 test sequences: the sampler repeats two.
    Dropped, the sums give the single-process value; kept, they do not."""
    one = course_lib_cli("evaluate", "--out", tmp_path / "one", "--checkpoint", saved)
    three = course_lib_cli("evaluate", "--out", tmp_path / "three", "--checkpoint", saved,
                           "--world-size", "3")
    assert one.returncode == three.returncode == 1  # the untrained weights, as above
    single = EvaluationReport.load(tmp_path / "one")
    e = EvaluationReport.load(tmp_path / "three")
    d = e.distributed
    assert e.world_size == d.world_size == 3 and e.backend == "gloo"
    assert [r.sequences for r in d.ranks] == [86, 86, 86] and d.repeats == 2
    assert sum(r.repeats for r in d.ranks) == 2

    def vec(s: Score) -> torch.Tensor:
        return torch.tensor([s.loss_per_token, s.token_accuracy], dtype=torch.float64)

    reference = vec(Score(single.loss_per_token, single.token_accuracy))
    assert torch.allclose(vec(d.token_weighted), reference, rtol=RTOL, atol=0.0)
    assert torch.allclose(vec(d.single_process), reference, rtol=RTOL, atol=0.0)
    assert d.matches_single_process and d.max_abs_diff <= RTOL * float(reference.abs().max())
    assert e.test_tokens == single.test_tokens
    assert e.loss_per_token == d.token_weighted.loss_per_token
    # the negative controls fail the same comparison
    assert not torch.allclose(vec(d.duplicates_kept), reference, rtol=RTOL, atol=0.0)
    assert not torch.allclose(vec(d.mean_of_rank_means), reference, rtol=RTOL, atol=0.0)
    assert sum(r.tokens for r in d.ranks) > e.test_tokens  # the repeats' tokens

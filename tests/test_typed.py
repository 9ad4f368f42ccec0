"""One decoder for every file the package reads back (``core.typed``): the
reports, the run file, ``trainer.json``, the per-rank log events, the
launched-apart checks' artifacts and ``elsewhere.json``.

Each type round-trips through its JSON, the committed reports still read
back with the same keys and values, and a file that does not fit its class
fails in one line that names the key.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import pkgutil
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

import course_lib
from course_lib.checks.uneven import UnevenFailure, UnevenResult
from course_lib.checks.world_size import WorldSizeGrads
from course_lib.core.typed import DecodeError, decode, encode
from course_lib.jobs import SPECS
from course_lib.jobs.frameworks import Configuration, FrameworksJob
from course_lib.jobs.parity import GradSample, ParityReport
from course_lib.reports import logs
from course_lib.reports.store import Elsewhere, Report, location_path, to_json
from course_lib.run.runfile import RunFile, job_from_dict
from tests.conftest import ROOT


def _all_modules() -> None:
    skip = ("forkserver", "__main__", "worker_entry")
    for m in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        if not any(s in m.name for s in skip):
            importlib.import_module(m.name)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return sorted(set(found), key=lambda c: f"{c.__module__}.{c.__name__}")


_all_modules()
REPORTS = [c for c in _subclasses(Report) if dataclasses.is_dataclass(c)]


def sample(hint: Any, depth: int = 0) -> Any:
    """A value of every kind ``hint`` allows the first of: one item per list
    (none, and None, deep down in a type that holds itself)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if depth > 6 and type(None) in args:
            return None
        return sample(next(a for a in args if a is not type(None)), depth)
    if origin is typing.Literal:
        return args[0]
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: sample(hints[f.name], depth + 1)
                       for f in dataclasses.fields(hint) if f.init and f.name != "extra"})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if origin is list:
        if depth > 6:
            return []
        return [sample(args[0], depth + 1)] if args else ["x"]
    if origin is tuple:
        items = [a for a in args if a is not Ellipsis]
        return tuple(sample(a, depth + 1) for a in items)
    if origin is dict:
        key = 3 if args and args[0] is int else "k"
        return {key: sample(args[1], depth + 1)} if args else {"k": "v"}
    if hint is dict:
        return {"k": "v"}
    if hint is list:
        return ["x"]
    if hint is bool:
        return True
    if hint is int:
        return 7
    if hint is float:
        return 0.25
    if hint is str:
        return "word"
    if hint is torch.Tensor:
        return torch.arange(3.0)
    return "any"


def _json(obj: Any) -> Any:
    return json.loads(to_json(encode(obj)))


def _parity() -> dict[str, Any]:
    """A parity report's JSON, with its two modes."""
    doc = _json(sample(ParityReport))
    doc["modes"] = {m: doc["modes"]["k"] for m in ("global_token", "mean_of_means")}
    return doc


# --- the reports ---------------------------------------------------------------------


def test_every_report_is_found():
    names = {c.__name__ for c in REPORTS}
    assert {"ParityReport", "AuditReport", "FrameworksReport", "Matrix", "LossRuns",
            "LoggingData", "CellTimes", "RecipesReport"} <= names


@pytest.mark.parametrize("cls", REPORTS, ids=lambda c: c.__name__)
def test_every_report_round_trips_through_its_json(cls, tmp_path):
    report = sample(cls)
    report.save(tmp_path)
    back = cls.load(tmp_path)
    assert back == report
    assert _json(back) == _json(report)
    assert back.to_dict() == report.to_dict()


@pytest.mark.parametrize("cls", REPORTS, ids=lambda c: c.__name__)
def test_a_report_lacking_a_key_is_one_line_naming_it(cls):
    doc = _json(sample(cls))
    required = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "extra"
                and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    if not required:
        pytest.skip("every key has a default")
    del doc[required[-1]]
    with pytest.raises(DecodeError) as err:
        cls.from_dict(doc)
    message = str(err.value)
    assert "\n" not in message and f"lacks key {required[-1]!r}" in message


def test_unknown_keys_land_in_extra_on_a_report_and_fail_below_it():
    doc = _parity()
    doc["future_field"] = 1
    assert ParityReport.from_dict(doc).extra == {"future_field": 1}
    doc["modes"]["global_token"]["surprise"] = 2
    with pytest.raises(DecodeError, match=r"^modes\.global_token: Comparison has no key "
                                          r"'surprise'$"):
        ParityReport.from_dict(doc)


def test_a_value_of_the_wrong_kind_is_one_line_naming_where():
    doc = _parity()
    doc["local_tokens"] = [1, "two"]
    with pytest.raises(DecodeError, match=r"^local_tokens\[1\]: expects int, got str$"):
        ParityReport.from_dict(doc)
    doc = _parity()
    doc["modes"]["global_token"]["allclose"] = "yes"
    with pytest.raises(DecodeError, match=r"^modes\.global_token\.allclose: expects bool"):
        ParityReport.from_dict(doc)


def test_null_reads_back_as_none_where_allowed_and_nan_for_a_float():
    doc = _parity()
    doc["modes"]["global_token"]["max_abs_err"] = None  # float | None
    doc["atol"] = None  # float: a NaN written as null
    report = ParityReport.from_dict(doc)
    assert report.modes["global_token"].max_abs_err is None
    assert report.atol != report.atol
    doc["step"] = None
    with pytest.raises(DecodeError, match="^step: null where int is expected$"):
        ParityReport.from_dict(doc)


# The reports kept in the repository: read back, then written again, they
# hold exactly the keys and values on disk. The matrix renames old formula
# names on reading (Matrix.from_dict) and gains keys added since it was
# measured; its keys on disk all stay.
COMMITTED = {"LossRuns": "data/trl-grpo-loss.json",
             "LoggingData": "data/frameworks-logging.json",
             "CellTimes": "data/cell-times.json",
             "RecipesReport": "docs/recipes-report.json",
             "BugsReport": "docs/cheatsheet-bugs.json",
             "Matrix": "data/frameworks-matrix.json"}


def _keys(doc: Any, where: str = "") -> set[str]:
    if isinstance(doc, dict):
        return {f"{where}.{k}" for k in doc} | {
            x for k, v in doc.items() for x in _keys(v, f"{where}.{k}")}
    if isinstance(doc, list):
        return {x for i, v in enumerate(doc) for x in _keys(v, f"{where}[{i}]")}
    return set()


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_reports_read_back_with_the_same_keys_and_values(name):
    cls = next(c for c in REPORTS if c.__name__ == name)
    raw = json.loads((ROOT / COMMITTED[name]).read_text())
    report = cls.from_dict(raw)
    again = json.loads(to_json(report.to_dict()))
    if name == "Matrix":
        assert _keys(raw) <= _keys(again)
        assert cls.from_dict(again) == report
    else:
        assert again == raw


# --- the run file --------------------------------------------------------------------


@pytest.mark.parametrize("tag", sorted(SPECS))
def test_every_job_spec_round_trips_through_the_run_file(tag, tmp_path):
    spec = sample(SPECS[tag])
    run = RunFile(config={"name": "x"}, backend="gloo", device="cpu", data_dir="d",
                  out="o", jobs=[spec], fault=None)
    run.write(tmp_path / "run.json")
    back = RunFile.read(tmp_path / "run.json", SPECS)
    assert back == run and type(back.jobs[0]) is SPECS[tag]
    assert json.loads((tmp_path / "run.json").read_text())["jobs"][0]["job"] == tag


def test_a_frameworks_job_carries_its_configurations_typed(tmp_path):
    job = FrameworksJob([Configuration("hf", "llama", {"average_tokens_across_devices": True})])
    run = RunFile(config={}, backend="gloo", device="cpu", data_dir="d", out="o", jobs=[job])
    run.write(tmp_path / "run.json")
    on_disk = json.loads((tmp_path / "run.json").read_text())["jobs"][0]
    assert on_disk["configurations"] == [{"framework": "hf", "model": "llama", "flags": {
        "average_tokens_across_devices": True}, "uses": {}}]  # uses: --with, none here
    (back,) = RunFile.read(tmp_path / "run.json", SPECS).jobs
    assert isinstance(back, FrameworksJob)
    assert back.configurations == job.configurations
    assert isinstance(back.configurations[0], Configuration)


def test_a_run_file_that_does_not_fit_is_one_line(tmp_path):
    with pytest.raises(DecodeError, match=r"^job: unknown job 'nope'$"):
        job_from_dict({"job": "nope"}, SPECS)
    with pytest.raises(DecodeError, match=r"^jobs\[0\]: TrainJob has no key 'stopp'$"):
        RunFile.from_dict({"config": {}, "backend": "gloo", "device": "cpu",
                           "data_dir": "d", "out": "o", "jobs": [
                               {"job": "train", "run_dir": "r", "label": "l", "stop": 1,
                                "stopp": 2}]}, SPECS)
    doc = {"config": {}, "backend": "gloo", "device": "cpu", "data_dir": "d",
           "out": "o", "jobs": [{"job": "frameworks", "configurations": [{"model": "x"}]}]}
    (tmp_path / "run.json").write_text(json.dumps(doc))
    with pytest.raises(DecodeError, match=r"^run\.json: jobs\[0\]\.configurations\[0\]: "
                                          r"Configuration lacks key 'framework'$"):
        RunFile.read(tmp_path / "run.json", SPECS)


# --- the per-rank log events --------------------------------------------------------


def test_every_event_the_package_logs_has_a_type():
    logged = set()
    for path in (ROOT / "course_lib").rglob("*.py"):
        logged |= set(re.findall(r'\bctx\.log\(\s*"(\w+)"', path.read_text()))
    assert logged, "the pattern finds the rank's log calls"
    assert logged <= set(logs.EVENTS), sorted(logged - set(logs.EVENTS))


def test_a_step_event_reads_back_typed_and_one_lacking_its_loss_is_one_line(tmp_path):
    line = {"event": "step", "job": "train", "rank": 1, "time": 5.0, "run": "stop",
            "step": 3, "window": 2, "local_tokens": 10, "global_tokens": 30,
            "local_loss_sum": 12.0, "loss": 1.5}
    path = tmp_path / "logs" / "train-rank1.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(line) + "\n" + '{"event": "st' + "\n")  # a line cut short
    (ev,) = logs.steps(tmp_path)[1]
    assert isinstance(ev, logs.Step) and (ev.step, ev.loss, ev.local_tokens) == (3, 1.5, 10)
    assert logs.loss_curve(tmp_path) == [(3, 12.0 / 30)]
    del line["loss"]
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(DecodeError, match=r"^train-rank1\.jsonl:1: Step lacks key 'loss'$"):
        logs.records(tmp_path)


def test_an_event_no_type_names_keeps_its_fields():
    ev = logs.parse({"event": "new_thing", "job": "x", "rank": 0, "time": 1.0, "n": 3})
    assert type(ev) is logs.Event and ev.extra == {"n": 3}


# --- the launched-apart checks' artifacts, elsewhere.json, grad_sample -------------


def test_the_uneven_checks_files_round_trip_and_stay_what_chapter_05_loads(tmp_path):
    saved = UnevenResult([torch.ones(3), torch.zeros(3)], torch.arange(3.0), [3, 6])
    saved.save(tmp_path / "a.pt")
    back = UnevenResult.load(tmp_path / "a.pt")
    assert torch.equal(back.reference, saved.reference) and back.microbatches == [3, 6]
    assert all(torch.equal(a, b) for a, b in zip(back.grads, saved.grads, strict=True))
    plain = torch.load(tmp_path / "a.pt")  # as the chapter reads it
    assert list(plain) == ["grads", "reference", "microbatches"]
    UnevenFailure("rank 1 failed", 1).save(tmp_path / "s.failed.json")
    assert json.loads((tmp_path / "s.failed.json").read_text()) == {
        "error": "rank 1 failed", "rank": 1}
    assert UnevenFailure.load(tmp_path / "s.failed.json") == UnevenFailure("rank 1 failed", 1)
    torch.save({"grads": [torch.ones(2)]}, tmp_path / "b.pt")
    with pytest.raises(DecodeError, match=r"^b\.pt: WorldSizeGrads lacks key 'local_tokens'$"):
        WorldSizeGrads.load(tmp_path / "b.pt")


def test_elsewhere_json_round_trips(tmp_path):
    assert Elsewhere.read(tmp_path) is None
    Elsewhere("node0", "/runs/x").write(tmp_path)
    assert json.loads(location_path(tmp_path).read_text()) == {"host": "node0",
                                                               "out": "/runs/x"}
    where = Elsewhere.read(tmp_path)
    assert where == Elsewhere("node0", "/runs/x")
    assert where.report("parity") == "node0:/runs/x/reports/parity.json"


def test_grad_sample_is_typed_and_still_indexed_by_its_keys():
    s = GradSample(index=[0, 5], reference=[1.0, 2.0], global_token=[1.0, 2.0],
                   mean_of_means=[0.5, 1.0])
    assert s.of("mean_of_means") == [0.5, 1.0] and s["reference"] == [1.0, 2.0]
    assert list(s) == ["index", "reference", "global_token", "mean_of_means"]
    assert encode(s) == dict(s)
    with pytest.raises(KeyError):
        s.of("index")
    assert decode(GradSample, encode(s)) == s


@dataclasses.dataclass(frozen=True)
class Inner:
    a: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AtPath:
    where: Path


def test_encode_merges_only_the_outer_extra():
    doc = encode(Outer(Inner(1, {"b": 2}), {"c": 3}))
    assert doc == {"inner": {"a": 1, "extra": {"b": 2}}, "c": 3}
    assert decode(Outer, doc) == Outer(Inner(1, {"b": 2}), {"c": 3})


def test_trainer_json_reads_back_typed(tmp_path):
    from course_lib.core.checkpoint import TRAINER, Trainer

    doc = {"step": 7, "world_size": 2, "config": {"name": "x"}, "config_fingerprint": "f",
           "data_lock": "d", "sampler": {"seed": 1, "position": 1,
                                         "rng_state": [3, [1, 2], None],
                                         "history": [[[[1, 2]], [[3, 4]]]]},
           "backend": "gloo", "device": "cpu", "run": "stop", "other": 1}
    (tmp_path / TRAINER).write_text(json.dumps(doc))
    found = Trainer.read(tmp_path)
    assert (found.step, found.sampler.position, found.run) == (7, 1, "stop")
    assert found.sampler.rng_state == (3, [1, 2], None) and found.extra == {"other": 1}
    assert json.loads(to_json(encode(found))) == doc
    del doc["data_lock"]
    with pytest.raises(DecodeError, match=r"^trainer\.json: Trainer lacks key 'data_lock'$"):
        Trainer.of(doc)


def test_a_path_keeps_its_type_hint_name_in_messages():
    with pytest.raises(DecodeError, match="^where: expects Path, got int$"):
        decode(AtPath, {"where": 3})


def test_what_a_rank_logs_reads_back_as_its_event_type(tmp_path, cfg, corpus):
    from course_lib.rank.context import JobState, RankContext

    ctx = RankContext(cfg, 1, 2, "gloo", torch.device("cpu"), corpus,
                      JobState(out=tmp_path, job="train"))
    # the keys jobs.train.train_steps logs each update with
    ctx.log("step", run="stop", step=1, window=0, local_tokens=3, global_tokens=5,
            local_loss_sum=1.0, loss=0.2)
    ctx.log("checkpoint", run="stop", step=1)
    ctx.logs.close()
    step, saved = logs.records(tmp_path)[1]
    assert isinstance(step, logs.Step) and (step.rank, step.job, step.loss) == (1, "train", 0.2)
    assert isinstance(saved, logs.Checkpoint) and saved.step == 1 and not saved.extra

"""Config fuzz: any YAML value of any type in any field gives a Config or a
one-line ConfigError (CLI: exit 0, or exit 2 with one line), never a
traceback or a hang."""

import copy
import json

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from course_lib.core import data
from course_lib.core.config import Config, ConfigError, from_dict, load
from tests.conftest import ROOT, course_lib_cli

BASE = yaml.safe_load((ROOT / "configs" / "minimum.yaml").read_text())
BASE["exercise"] = yaml.safe_load((ROOT / "configs" / "exercise.yaml").read_text())["exercise"]
FIELDS = [(k,) for k, v in BASE.items() if not isinstance(v, dict)] + [
    (section, key) for section, body in BASE.items() if isinstance(body, dict)
    for key in body] + [(s,) for s, v in BASE.items() if isinstance(v, dict)]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.integers(),
    st.integers(2**31 - 3, 2**200), st.floats(), st.sampled_from([".nan", ".inf", "-.inf"]),
    st.text(max_size=12), st.dates(),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
changes = st.lists(st.tuples(st.sampled_from(FIELDS), values | st.just("<delete>")),
                   max_size=4)


def _apply(edits) -> dict:
    raw = copy.deepcopy(BASE)
    for path, value in edits:
        parent = raw
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        if value == "<delete>":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return raw


def _one_line(exc: ConfigError) -> None:
    text = str(exc)
    assert text and "\n" not in text and len(text) < 400, text


@settings(max_examples=400, deadline=None, database=None)
@given(changes)
def test_any_field_any_value_is_a_config_or_one_line(edits):
    raw = _apply(edits)
    try:
        cfg = from_dict(yaml.safe_load(yaml.safe_dump(raw)))
    except ConfigError as exc:
        _one_line(exc)
        return
    assert from_dict(cfg.to_dict()) == cfg
    assert len(cfg.protocol_fingerprint()) == 64
    for world in (1, 2, 3, 4):
        try:
            bands = data.rank_bands(cfg.with_world_size(world), world)
        except ConfigError as exc:
            _one_line(exc)
            continue
        assert len(bands) == world


@settings(max_examples=200, deadline=None, database=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1"))))
def test_any_yaml_text_is_a_config_or_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        assert isinstance(load(path), Config)
    except ConfigError as exc:
        _one_line(exc)


def test_non_utf8_config_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    try:
        load(path)
    except ConfigError as exc:
        _one_line(exc)
        assert "not UTF-8" in str(exc)
    else:
        raise AssertionError("accepted a non-UTF-8 file")


@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes)
@example(edits=[(("seed",), 99)])
@example(edits=[(("train", "world_size"), 999)])
def test_cli_prepare_exits_0_or_2_with_one_line(tmp_path, edits):
    config = tmp_path / "fuzz.yaml"
    config.write_text(yaml.safe_dump(_apply(edits)))
    proc = course_lib_cli("prepare", "--config", config, "--data-dir", tmp_path / "data",
                          "--out", tmp_path / "out")
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("course-lib: error: "), proc.stderr
    else:
        assert json.loads(proc.stdout)["status"] in ("written", "verified")

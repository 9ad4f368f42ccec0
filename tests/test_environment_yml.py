"""environment.yml and pyproject.toml must describe the same environment.

The conda file is checked against pyproject.toml, which is the source of truth:
- the channel list is exactly [conda-forge];
- every runtime and every ``[test]`` dependency of pyproject appears (conda
  names are mapped to pip names, e.g. ``pytorch`` -> ``torch``);
- nothing else appears, apart from ``python`` and ``pip``;
- every version range that conda may pick is accepted by pip's specifier (so
  ``pip install -e .`` never has to reinstall or upgrade a conda package), and
  the python pin satisfies ``requires-python``;
- the pip section installs the course itself with ``-e .``.

The checker is also run on drifted copies to prove that it can fail.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# conda-forge name -> PyPI name, where they differ
CONDA_TO_PIP = {"pytorch": "torch", "playwright-python": "playwright"}
ALLOWED_EXTRA = {"python", "pip"}
CHANNELS = ["conda-forge"]

_CONDA_SPEC = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*$")


class SpecError(ValueError):
    pass


def conda_specifier(text: str) -> tuple[str, SpecifierSet]:
    """``name<version spec>`` in conda's MatchSpec syntax -> (pip name, SpecifierSet).

    Supported: ``name``, ``name=1.2`` (conda's fuzzy 1.2.*), ``name==1.2``,
    ``name 1.2.*``, ``name>=1,<2`` and other comparison lists. Build strings,
    channels and ``|`` alternatives are refused rather than guessed at.
    """
    m = _CONDA_SPEC.match(text)
    if not m:
        raise SpecError(f"cannot parse conda spec {text!r}")
    name, rest = m.group(1), m.group(2).replace(" ", "")
    if "::" in text or "[" in text or "|" in rest:
        raise SpecError(f"unsupported conda spec {text!r} (channel, brackets or '|')")
    pip_name = canonicalize_name(CONDA_TO_PIP.get(name.lower(), name))
    if not rest:
        return pip_name, SpecifierSet()
    clauses = []
    for clause in rest.split(","):
        if re.fullmatch(r"=?[0-9][0-9A-Za-z.*]*", clause):  # '1.2', '=1.2': fuzzy 1.2.*
            clauses.append("==" + clause.lstrip("=").rstrip(".*") + ".*")
        elif re.fullmatch(r"(==|!=|>=|<=|>|<|~=)[0-9][0-9A-Za-z.*]*", clause):
            clauses.append(clause)
        else:
            raise SpecError(f"unsupported version clause {clause!r} in {text!r}")
    return pip_name, SpecifierSet(",".join(clauses))


def _release(spec_version: str) -> tuple[int, ...] | None:
    try:
        return Version(spec_version.rstrip(".*")).release
    except InvalidVersion:
        return None


def probe_versions(*specs: SpecifierSet) -> list[Version]:
    """Concrete versions around every boundary named in the specifiers.

    Each boundary b contributes b itself, b with each component bumped up
    and down, a patch level above b, and b's prefix; plus 0 and a huge version.
    Ranges built from these boundaries change membership only at them, so
    the probes see every region of every range.
    """
    releases = {(0,), (9999,)}
    for spec_set in specs:
        for spec in spec_set:
            rel = _release(spec.version)
            if rel is None:
                continue
            releases.add(rel)
            releases.add(rel + (1,))
            releases.add(rel + (0, 1))
            if len(rel) > 1:
                releases.add(rel[:-1])
            for i in range(len(rel)):
                for delta in (-1, 1):
                    part = rel[i] + delta
                    if part >= 0:
                        releases.add(rel[:i] + (part,) + rel[i + 1:])
                        releases.add(rel[:i] + (part, 99))
    return sorted(Version(".".join(map(str, r))) for r in releases)


def range_problem(name: str, conda: SpecifierSet, pip: SpecifierSet) -> str | None:
    """Why the conda range is not inside the pip range, or None when it is."""
    probes = probe_versions(conda, pip)
    conda_ok = [v for v in probes if conda.contains(v)]
    if not conda_ok:
        return f"{name}: conda spec {conda or '(any)'} admits no version"
    outside = [v for v in conda_ok if not pip.contains(v)]
    if outside:
        return (f"{name}: conda allows {outside[0]} but pyproject requires "
                f"{pip or '(any)'} (conda spec {conda or '(any)'})")
    return None


def load_pyproject(path: Path) -> tuple[dict[str, Requirement], SpecifierSet]:
    project = tomllib.loads(path.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    reqs += project.get("optional-dependencies", {}).get("test", [])
    declared = {}
    for text in reqs:
        req = Requirement(text)
        declared[canonicalize_name(req.name)] = req
    return declared, SpecifierSet(project.get("requires-python", ""))


def load_environment(path: Path) -> dict:
    env = yaml.safe_load(path.read_text())
    conda, pip, pip_lines = {}, {}, []
    for item in env.get("dependencies") or []:
        if isinstance(item, dict):
            pip_lines += list(item.get("pip") or [])
            continue
        name, spec = conda_specifier(str(item))
        if name in conda:
            raise SpecError(f"{name} listed twice in {path.name}")
        conda[name] = spec
    for line in pip_lines:
        line = str(line).strip()
        if line.startswith("-"):
            continue  # options such as -e .
        req = Requirement(line)
        pip[canonicalize_name(req.name)] = req.specifier
    return {"channels": env.get("channels"), "conda": conda, "pip": pip,
            "pip_lines": [str(x).strip() for x in pip_lines]}


def drift_problems(pyproject: Path, environment: Path) -> list[str]:
    declared, requires_python = load_pyproject(pyproject)
    try:
        env = load_environment(environment)
    except (SpecError, ValueError) as exc:
        return [str(exc)]
    problems = []
    if env["channels"] != CHANNELS:
        problems.append(f"channels must be exactly {CHANNELS}, got {env['channels']}")
    both = set(env["conda"]) & set(env["pip"])
    problems += [f"{n}: listed both as conda and pip package" for n in sorted(both)]
    listed = {**env["conda"], **env["pip"]}
    for name in sorted(set(declared) - set(listed)):
        problems.append(f"{name}: declared in pyproject.toml but missing in environment.yml")
    for name in sorted(set(listed) - set(declared) - ALLOWED_EXTRA):
        problems.append(f"{name}: in environment.yml but not declared in pyproject.toml")
    for name in sorted(set(listed) & set(declared)):
        problem = range_problem(name, listed[name], declared[name].specifier)
        if problem:
            problems.append(problem)
    if "python" not in env["conda"]:
        problems.append("python: environment.yml must pin python")
    else:
        problem = range_problem("python", env["conda"]["python"], requires_python)
        if problem:
            problems.append(problem.replace("pyproject requires", "requires-python is"))
    if "-e ." not in env["pip_lines"]:
        problems.append("pip section must install the course with '-e .'")
    return problems


# --- the real files -----------------------------------------------------------


def test_environment_yml_matches_pyproject():
    problems = drift_problems(ROOT / "pyproject.toml", ROOT / "environment.yml")
    assert problems == [], "environment.yml drifted from pyproject.toml:\n" + "\n".join(
        problems)


def test_environment_yml_lists_every_runtime_dependency_by_name():
    declared, _ = load_pyproject(ROOT / "pyproject.toml")
    env = load_environment(ROOT / "environment.yml")
    assert "torch" in env["conda"], "torch must come from conda-forge (as pytorch)"
    assert env["conda"]["python"].contains("3.11.9")
    assert not env["conda"]["python"].contains("3.12.0")
    assert len(declared) >= 10


# --- the checker itself -------------------------------------------------------


def test_conda_spec_parsing():
    assert conda_specifier("pytorch>=2.4,<2.14") == ("torch", SpecifierSet(">=2.4,<2.14"))
    name, spec = conda_specifier("python=3.11")
    assert name == "python" and spec.contains("3.11.7") and not spec.contains("3.1")
    assert not spec.contains("3.12")
    assert conda_specifier("numpy 1.26.*")[1] == SpecifierSet("==1.26.*")
    assert conda_specifier("pip") == ("pip", SpecifierSet())
    with pytest.raises(SpecError):
        conda_specifier("numpy >=1.26|<1")
    with pytest.raises(SpecError):
        conda_specifier("conda-forge::numpy")


@pytest.mark.parametrize(("conda", "pip", "ok"), [
    (">=2.4,<2.14", ">=2.4,<2.14", True),
    (">=2.5,<2.10", ">=2.4,<2.14", True),
    ("==2.8.*", ">=2.4,<2.14", True),
    (">=2.4", ">=2.4,<2.14", False),          # conda may pick 2.14
    (">=2.3,<2.14", ">=2.4,<2.14", False),    # conda may pick 2.3.x
    (">=2.4,<2.15", ">=2.4,<2.14", False),    # 2.14.x leaks through
    ("", ">=1.26", False),                    # unpinned on conda, pinned on pip
    (">=1.26", "", True),
    ("==2.14.*", ">=2.4,<2.14", False),
    (">=3.0,<2.0", "", False),                # empty conda range
])
def test_range_check(conda, pip, ok):
    problem = range_problem("pkg", SpecifierSet(conda), SpecifierSet(pip))
    assert (problem is None) is ok, problem


DRIFTS = {
    "drop a runtime dependency": (
        lambda t: t.replace("  - tqdm>=4.66\n", ""), "tqdm: declared in pyproject"),
    "drop a test dependency": (
        lambda t: t.replace("  - nbval>=0.11\n", ""), "nbval: declared in pyproject"),
    "undeclared conda package": (
        lambda t: t.replace("  - numpy>=1.26\n", "  - numpy>=1.26\n  - scipy\n"),
        "scipy: in environment.yml but not declared"),
    "undeclared pip package": (
        lambda t: t.replace("      - -e .\n", "      - requests\n      - -e .\n"),
        "requests: in environment.yml but not declared"),
    "extra channel": (
        lambda t: t.replace("  - conda-forge\n", "  - pytorch\n  - conda-forge\n"),
        "channels must be exactly"),
    "defaults channel": (
        lambda t: t.replace("  - conda-forge\n", "  - conda-forge\n  - defaults\n"),
        "channels must be exactly"),
    "torch range too wide": (
        lambda t: re.sub(r"  - pytorch[^\n]*\n", "  - pytorch>=2.4\n", t),
        "torch: conda allows"),
    "lower bound below pip's": (
        lambda t: re.sub(r"  - matplotlib[^\n]*\n", "  - matplotlib>=3.0\n", t),
        "matplotlib: conda allows"),
    "python outside requires-python": (
        lambda t: t.replace("  - python=3.11\n", "  - python=3.8\n"),
        "python: conda allows"),
    "no editable install": (
        lambda t: t.replace("      - -e .\n", ""), "'-e .'"),
    "pip name under conda": (
        lambda t: re.sub(r"  - pytorch([^\n]*)\n", r"  - torch\1\n  - pytorch\1\n", t),
        "torch listed twice"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_checker_catches_drift(tmp_path, drift):
    mutate, expected = DRIFTS[drift]
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    original = (ROOT / "environment.yml").read_text()
    drifted = mutate(original)
    assert drifted != original, f"the drift {drift!r} no longer applies to environment.yml"
    (tmp_path / "environment.yml").write_text(drifted)
    problems = drift_problems(tmp_path / "pyproject.toml", tmp_path / "environment.yml")
    assert any(expected in p for p in problems), (drift, problems)


def test_checker_catches_pyproject_drift(tmp_path):
    """A new pyproject dependency that environment.yml lacks is caught too."""
    text = (ROOT / "pyproject.toml").read_text()
    drifted = text.replace('"tqdm>=4.66",', '"tqdm>=4.66",\n    "rich>=13",')
    assert drifted != text
    (tmp_path / "pyproject.toml").write_text(drifted)
    shutil.copy(ROOT / "environment.yml", tmp_path / "environment.yml")
    problems = drift_problems(tmp_path / "pyproject.toml", tmp_path / "environment.yml")
    assert any(p.startswith("rich: declared in pyproject") for p in problems), problems

"""The version matrix: each pinned framework version, from the package
registry, in a venv of its own, audited by ``course-lib frameworks``.

    .venv/bin/python benchmarks/frameworks_matrix.py            # every entry
    .venv/bin/python benchmarks/frameworks_matrix.py --only transformers-5.10.1
    .venv/bin/python benchmarks/frameworks_matrix.py --quick  # this venv, nothing written
    .venv/bin/python benchmarks/frameworks_matrix.py --add transformers==5.25.0
    .venv/bin/python benchmarks/frameworks_matrix.py --configurations  # every --with

``--add PACKAGE==VERSION`` measures one more version and keeps it in the
matrix: its entry (``<package>-<version>``, its pins, the adapters it runs)
is stored in the committed file, and a later run of every entry runs it
again. ``tests/test_frameworks_unit.py`` fails when an installed framework
is newer than the matrix's newest measured row, and names this command.

Each entry gets ``runs/matrix/<name>/venv``: the pinned versions installed by
pip into it, in front of this checkout's ``.venv`` (a ``.pth`` adds the
latter's site-packages after the entry's own), so torch and the course are
shared and the framework versions are exactly the pinned ones. A venv that
is already there is reused. An entry pip cannot install (no such version, an
incompatible pair) is ``not run`` with pip's reason in one line. Writes
``data/frameworks-matrix.json`` (committed), with the date, the torch version
and this command. Not part of ``make test``: it downloads and installs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from course_lib.frameworks.evidence import (
    Configurations,
    FrameworkRow,
    Matrix,
    MatrixEntry,
    MatrixRow,
)
from course_lib.jobs.frameworks import FrameworksReport
from course_lib.reports.store import to_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "matrix"

# name -> (pins, frameworks audited). The transformers versions are the
# boundaries the research notes name; each with an accelerate and a datasets
# of its time (a newer datasets, shared from .venv, needs a newer hub).
ENTRIES: dict[str, tuple[list[str], str]] = {
    "transformers-4.45.2": (["transformers==4.45.2", "accelerate==1.0.1", "datasets<4"],
                            "hf"),
    "transformers-4.46.0": (["transformers==4.46.0", "accelerate==1.0.1", "datasets<4"],
                            "hf"),
    "transformers-4.46.2": (["transformers==4.46.2", "accelerate==1.1.1", "datasets<4"],
                            "hf"),
    "transformers-4.46.3": (["transformers==4.46.3", "accelerate==1.1.1", "datasets<4"],
                            "hf"),
    "transformers-4.54.1": (["transformers==4.54.1", "accelerate==1.9.0", "datasets<4.1"],
                            "hf"),
    "transformers-5.9.0": (["transformers==5.9.0", "accelerate==1.12.0"], "hf"),
    "transformers-5.10.1": (["transformers==5.10.1", "accelerate==1.12.0"], "hf"),
    "transformers-5.15.1": (["transformers==5.15.1", "accelerate==1.13.0"], "hf"),
    "transformers-5.24.0": (["transformers==5.24.0", "accelerate==1.15.0"], "hf,accelerate"),
    "lightning-2.6.6": (["lightning==2.6.6"], "lightning"),
    "lightning-2.4.0": (["lightning==2.4.0"], "lightning"),
    "trl-1.16.0": (["trl==1.16.0", "transformers==5.24.0", "accelerate==1.15.0"], "trl"),
    "trl-0.19.1": (["trl==0.19.1", "transformers==4.54.1", "accelerate==1.9.0",
                    "datasets<4.1"], "trl"),
    # Unsloth pins its own torch, transformers and TRL into the entry's venv.
    "unsloth-2026.10.9": (["unsloth==2026.10.9"], "unsloth"),
}
MODELS = "gpt2,llama"
# --add: the adapters a new version of each package runs, and the packages
# whose installed version the matrix must cover.
ADAPTERS_OF = {"transformers": "hf,accelerate", "accelerate": "hf,accelerate",
               "lightning": "lightning", "trl": "trl"}

# Frameworks from the research notes that have no adapter yet: each is
# installed from the registry and probed, and its entry says why it did not
# run. name -> (pins, probe run in its venv, why no adapter when it imports).
TRIED: dict[str, tuple[list[str], str, str]] = {
    "torchtune-0.6.1": (
        # torchao 0.18 dropped the nf4tensor module torchtune 0.6.1 imports.
        ["torchtune==0.6.1", "torchao==0.11.0"],
        "import torchtune.training, torchtune.modules.loss",
        "installs and imports; no adapter: its training loop is a recipe script "
        "(tune run full_finetune_distributed) driven by a YAML config that loads a "
        "checkpoint, a tokenizer and a dataset from files, not a loop fed in Python"),
    "torchtitan-0.3.0": (
        ["torchtitan==0.3.0"],
        "import torchtitan.train, torchtitan.components.loss",
        "installs and imports; no adapter: its Trainer is built from a job config "
        "(TOML) with a tokenizer and a dataset it loads itself, and parallelizes a "
        "model from its own registry, not a transformers model"),
}


def venv(name: str) -> Path:
    """The entry's venv, made once, in front of this checkout's .venv."""
    home = OUT / name / "venv"
    python = home / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
        site = Path(sysconfig.get_paths(vars={"base": str(home), "platbase": str(home)})
                    ["purelib"])
        shared = sysconfig.get_paths()["purelib"]
        (site / "zz-course-shared.pth").write_text(
            f"import site; site.addsitedir({shared!r})\n")
    return python


def install(name: str, pins: list[str]) -> str | None:
    """None when the pins are installed, else pip's reason in one line."""
    python = venv(name)
    stamp = OUT / name / "installed.json"
    if stamp.exists() and json.loads(stamp.read_text()) == pins:
        return None
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--quiet", "--disable-pip-version-check", *pins],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [x.strip() for x in proc.stderr.splitlines()
                 if x.strip().startswith("ERROR") or "conflict" in x.lower()]
        return (lines[0] if lines else proc.stderr.strip().splitlines()[-1])[:300]
    stamp.write_text(json.dumps(pins))
    return None


def probe(name: str, pins: list[str], code: str, no_adapter: str) -> str:
    """Why a framework without an adapter did not run: pip's reason, the
    import's error, or the missing adapter, in one line."""
    reason = install(name, pins)
    if reason is not None:
        return reason
    proc = subprocess.run([str(venv(name)), "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [x.strip() for x in proc.stderr.splitlines() if x.strip()]
        return f"does not import here: {(lines or ['no output'])[-1][:260]}"
    return no_adapter


def audit(name: str, frameworks: str, python: Path | None = None, out: Path | None = None,
          models: str = MODELS, uses: str = "", timeout: int = 600
          ) -> tuple[list[FrameworkRow], str]:
    """``course-lib frameworks`` in the entry's venv (or ``python``), with the
    ``--with`` configurations ``uses``: its rows, or why there are none."""
    python = python or venv(name)
    out = out or OUT / name / "out"
    cmd = [str(python), "-m", "course_lib", "frameworks", "--framework", frameworks,
           "--model", models, "--out", str(out), "--timeout", str(timeout),
           *(["--with", uses] if uses else [])]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    report = out / "reports" / "frameworks.json"
    if not report.exists() or proc.returncode == 2:
        why = (proc.stderr.strip().splitlines() or ["no report"])[-1][:300]
        return [], why
    return list(FrameworksReport.load(out).rows), ""


def matrix(entries: dict[str, MatrixEntry], command: str, models: str = MODELS,
           kind: type[Matrix] = Matrix) -> Matrix:
    import torch

    # The entries in the table's order (an entry dropped from it is dropped);
    # The tables' entries first, then those added (--add) and --quick's.
    order = [n for n in [*ENTRIES, *TRIED] if n in entries]
    order += [n for n in entries if n not in order]
    return kind(
        date=datetime.date.today().isoformat(), torch=torch.__version__,
        python=sys.version.split()[0], command=command,
        models=models.split(","), entries={n: entries[n] for n in order},
        # The same rows as reports/frameworks.json, each with its entry's name.
        rows=[MatrixRow(**{f.name: getattr(row, f.name) for f in dataclasses.fields(row)},
                        entry=n) for n in order for row in entries[n].rows],
    )


def quick() -> int:
    """One entry's whole path on the stack installed here: this venv (no pip),
    the HF Trainer on GPT-2, the matrix built and read back, nothing written."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rows, reason = audit("installed", "hf", Path(sys.executable), Path(tmp), "gpt2")
    entry = MatrixEntry([], "hf", "not run" if reason else "measured", reason, rows)
    verdicts = ", ".join(f"{r.model} {r.verdict}" for r in rows) or reason
    print(f"{'installed':<22} {time.monotonic() - started:6.1f} s  {verdicts}", flush=True)
    found = matrix({"installed": entry}, "python benchmarks/frameworks_matrix.py --quick",
                   "gpt2")
    back = Matrix.from_dict(json.loads(to_json(found.to_dict())))
    print(f"matrix: {len(back.rows)} rows, read back ({Matrix.path().name} left as it is)")
    return 1 if reason else 0


# --configurations: the frameworks whose --with configurations it measures
# (every option applies to one of them at least), one launch each.
CONFIGURED = ("hf", "trl")


def configurations(timeout: int) -> int:
    """Every ``--with`` configuration on this venv's frameworks, both models,
    every flag set: ``data/frameworks-configurations.json``. One launch per
    framework holds all of its configurations."""
    from collections import Counter

    from course_lib.frameworks import adapter, installed, options
    from course_lib.jobs.frameworks import stack

    orphans = [n for n, o in options.OPTIONS.items() if not set(o.frameworks) & set(CONFIGURED)]
    if orphans:
        raise SystemExit(f"--configurations: {', '.join(orphans)} applies to none of "
                         f"{', '.join(CONFIGURED)}")
    pins = [f"{package}=={version}" for package, version in stack().items()]
    entries = {}
    for framework in CONFIGURED:
        names = [n for n, o in options.OPTIONS.items() if framework in o.frameworks]
        package = adapter(framework).package
        started = time.monotonic()
        rows, reason = audit(framework, framework, Path(sys.executable),
                             OUT / "configurations" / framework, uses=",".join(names),
                             timeout=timeout)
        # An entry per framework: its version is in each row, and in the pins.
        entries[framework] = MatrixEntry(
            pins, framework, "not run" if reason else "measured", reason, rows)
        verdicts = ", ".join(f"{n} {v}" for v, n in Counter(
            str(r.verdict) for r in rows).items()) or reason
        print(f"{package + ' ' + str(installed(package)):<22} "
              f"{time.monotonic() - started:6.1f} s  {len(rows)} rows: "
              f"{verdicts}", flush=True)
    matrix(entries, "python benchmarks/frameworks_matrix.py --configurations",
           kind=Configurations).write()
    print(f"wrote {Configurations.path().relative_to(ROOT)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated entry names")
    parser.add_argument("--add", action="append", default=[], metavar="PACKAGE==VERSION",
                        help=f"measure one more version of {', '.join(ADAPTERS_OF)} "
                             "and keep it in the matrix (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="this venv's HF Trainer on GPT-2: no install, no file written")
    parser.add_argument("--configurations", action="store_true",
                        help="every --with configuration on this venv's frameworks -> "
                             f"data/{Configurations.NAME}.json")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="with --configurations: seconds for each framework's launch")
    args = parser.parse_args()
    if args.configurations:
        if args.only or args.add or args.quick:
            parser.error("--configurations audits this venv: drop --only, --add, --quick")
        return configurations(args.timeout)
    if args.quick:
        if args.only:
            parser.error("--quick audits this venv: drop --only")
        return quick()
    entries = dict(Matrix.committed().entries) if Matrix.path().exists() else {}
    known = {**ENTRIES, **{n: (e.pins, e.frameworks) for n, e in entries.items()
                           if n not in ENTRIES and n not in TRIED and e.frameworks}}
    added = {}
    for spec in args.add:
        package, _, version = spec.partition("==")
        if package not in ADAPTERS_OF or not version:
            parser.error(f"--add {spec}: expected PACKAGE==VERSION, PACKAGE one of "
                         f"{', '.join(ADAPTERS_OF)}")
        added[f"{package}-{version}"] = ([spec], ADAPTERS_OF[package])
    known.update(added)
    names = (args.only.split(",") if args.only else list(added)
             or [*known, *TRIED])
    unknown = [n for n in names if n not in known and n not in TRIED]
    if unknown:
        parser.error(f"--only: unknown entries {', '.join(unknown)}")
    for name in names:
        started = time.monotonic()
        if name in TRIED:
            pins, code, no_adapter = TRIED[name]
            why = probe(name, pins, code, no_adapter)
            entries[name] = MatrixEntry(pins, "", "not run", why)
            print(f"{name:<22} {time.monotonic() - started:6.1f} s  not run: {why}", flush=True)
            continue
        pins, frameworks = known[name]
        reason = install(name, pins)
        rows: list[FrameworkRow] = []
        if reason is None:
            rows, reason = audit(name, frameworks)
        entries[name] = MatrixEntry(pins, frameworks, "not run" if reason else "measured",
                                    reason or "", rows)
        verdicts = ", ".join(f"{r.model} {r.verdict}" for r in rows) or reason
        print(f"{name:<22} {time.monotonic() - started:6.1f} s  {verdicts}", flush=True)
    matrix(entries, "python benchmarks/frameworks_matrix.py"
           + (f" --only {args.only}" if args.only else "")
           + "".join(f" --add {spec}" for spec in args.add)).write()
    print(f"wrote {Matrix.path().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

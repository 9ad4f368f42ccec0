"""The per-rank JSON-lines logs, ``<out>/logs/<job>-rank<R>.jsonl``: one reader.

Every rank appends one record per event (``start``, ``step``, ``error``, ...)
with its ``time``; the launcher's diagnosis, the timing of a launch, the
loss curves and the tests all read them through ``read``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def rank_of(path: Path) -> int | None:
    """``train-rank1.jsonl`` -> 1."""
    try:
        return int(Path(path).stem.rsplit("rank", 1)[1])
    except (IndexError, ValueError):
        return None


def lines(path: Path) -> list[Record]:
    """Every record of one JSON-lines file; a line cut short (a writer killed
    mid-line) or not an object is skipped, and a missing file has none."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            found.append(rec)
    return found


def read(dirs: Path | Iterable[Path], job: str = "*", since: float | None = None
         ) -> dict[int, list[tuple[Path, Record]]]:
    """{rank: [(log file, record), ...]} in time order, for one job or all.

    ``since``: only records written at or after this wall-clock time. A line
    cut short (a worker killed mid-write) or not a record is skipped.
    """
    dirs = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    by_rank: dict[int, list[tuple[Path, Record]]] = {}
    for d in dirs:
        for path in sorted((d / "logs").glob(f"{job}-rank*.jsonl")):
            rank = rank_of(path)
            if rank is None:
                continue
            for rec in lines(path):
                if isinstance(rec.get("time"), (int, float)) and (
                        since is None or rec["time"] >= since):
                    by_rank.setdefault(rank, []).append((path, rec))
    for recs in by_rank.values():
        recs.sort(key=lambda pr: pr[1]["time"])
    return by_rank


def records(run_dir: Path, job: str = "train") -> dict[int, list[Record]]:
    """{rank: [record, ...]} of one job's logs in ``run_dir``."""
    return {rank: [rec for _, rec in recs] for rank, recs in read(run_dir, job).items()}


def loss_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, window loss per token) from the per-rank train logs."""
    per_step: dict[int, list[Record]] = {}
    for recs in records(run_dir).values():
        for rec in recs:
            if rec["event"] == "step":
                per_step.setdefault(rec["step"], []).append(rec)
    return [
        (step, sum(r["local_loss_sum"] for r in recs) / recs[0]["global_tokens"])
        for step, recs in sorted(per_step.items())
    ]

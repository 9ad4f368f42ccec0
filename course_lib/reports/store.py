"""Reports: one dataclass per schema, written and read by that same class.

A report is a frozen dataclass that derives from ``Report`` and names its
file (``NAME``). ``report.save(out)`` writes ``<out>/reports/<NAME>.json``
atomically; ``Cls.load(out)`` reads it back as the same class, nested
dataclasses included, through the one decoder (``core.typed``): a value of
the wrong kind or a missing key fails in one line. Keys the report does not
know are kept in ``extra`` (the contract welcomes extra keys), so a newer
report still loads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from course_lib.core import paths
from course_lib.core.files import write_atomically
from course_lib.core.typed import decode, encode, read_json, write_json

R = TypeVar("R", bound="Report")


def report_path(out: Path, name: str) -> Path:
    return Path(out) / "reports" / f"{name}.json"


def location_path(out: Path) -> Path:
    """Written on nodes without global rank 0: where its reports went."""
    return Path(out) / "reports" / "elsewhere.json"


@dataclass(frozen=True)
class Elsewhere:
    """``<out>/reports/elsewhere.json``: a node without global rank 0 notes
    the host and the folder where rank 0 wrote the reports."""

    host: str
    out: str

    def report(self, name: str) -> str:
        """Where the report ``name`` is: ``host:out/reports/name.json``."""
        return f"{self.host}:{self.out}/reports/{name}.json"

    def write(self, out: Path) -> Path:
        return write_json(self, location_path(out))

    @classmethod
    def read(cls, out: Path) -> Elsewhere | None:
        """The note in ``out``, or None where this node has none."""
        path = location_path(out)
        return read_json(cls, path) if path.is_file() else None


def _finite(obj: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def to_json(data: Any) -> str:
    return json.dumps(_finite(data), indent=2, allow_nan=False) + "\n"


@dataclass(frozen=True)
class RunHeader:
    """Where a report's numbers were measured: the first keys of most reports."""

    world_size: int
    backend: str
    device: str
    dtype: str
    nccl_reference_path: bool
    torch: str

    def fields(self) -> dict[str, Any]:
        """The header's keys, to spread into a report: ``Report(**h.fields(), ...)``."""
        return {f.name: getattr(self, f.name) for f in fields(RunHeader)}

    @classmethod
    def of(cls, report: RunHeader) -> RunHeader:
        """The header part of a report that has one."""
        return cls(**RunHeader.fields(report))


class Report:
    """Base of every report dataclass. Subclasses set ``NAME``, the file stem,
    and end with ``extra: dict = field(default_factory=dict, repr=False)``."""

    NAME: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data

    def save(self, out: Path, name: str | None = None) -> Path:
        return write(out, name or self.NAME, self.to_dict())

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        return decode(cls, data)

    @classmethod
    def load(cls: type[R], out: Path, name: str | None = None) -> R:
        """``<out>/reports/<name or NAME>.json`` as this class."""
        path = report_path(out, name or cls.NAME)
        if not path.is_file():
            raise FileNotFoundError(f"no {path.stem} report in {path.parent} yet")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def exists(cls, out: Path, name: str | None = None) -> bool:
        return report_path(out, name or cls.NAME).is_file()


class Committed(Report):
    """A report kept in the repository, ``data/<NAME>.json``: a benchmark
    writes it, the tables and the chapters read it."""

    @classmethod
    def path(cls) -> Path:
        return paths.data_dir() / f"{cls.NAME}.json"

    @classmethod
    def committed(cls: type[R]) -> R:
        found = paths.data_dir() / f"{cls.NAME}.json"
        if not found.is_file():
            raise FileNotFoundError(f"no {found.name} in {found.parent}: its benchmark "
                                    "writes it")
        return cls.from_dict(json.loads(found.read_text()))

    def write(self) -> Path:
        return write_atomically(self.path(), to_json(self.to_dict()).encode())


def write(out: Path, name: str, data: dict[str, Any]) -> Path:
    """``<out>/reports/<name>.json``, atomically, as strict JSON (NaN -> null).
    ``Report.save`` writes through here."""
    path = report_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, to_json(data).encode())


__all__ = ["Committed", "Elsewhere", "Report", "RunHeader", "field", "location_path",
           "report_path", "to_json", "write"]

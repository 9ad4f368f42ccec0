"""One decoder: a dataclass from its JSON, checked as it is read.

The reports (``reports.store``), the run file (``run.runfile``), the
checkpoint's ``trainer.json``, the per-rank log events and the launched-apart
checks' artifacts all read their files back through ``decode``. It follows
the dataclass's annotations all the way down: nested dataclasses, lists,
tuples, dicts, ``X | None``, ``Literal`` and ``str`` enums. A value of the
wrong kind, a missing key, or a key the class does not know fails in one
line that names where in the file it is (``rows[2].counts: WindowCounts
lacks key 'N'``). A class with an ``extra`` field keeps the keys it does
not know there instead: the reports' contract welcomes extra keys.

``encode`` is its inverse: the dataclass as plain JSON values, so
``decode(type(x), encode(x)) == x``. The outer object's ``extra`` is merged
back into it; a nested one's stays its ``extra`` key, as ``asdict`` wrote it
(``data/frameworks-logging.json``'s ``run``), and ``decode`` reads that key
back into the field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

EXTRA = "extra"  # the field that keeps the keys a class does not know


class DecodeError(ValueError):
    """A file that does not fit its class: one line, naming where."""


def decode(cls: type[T], data: object, where: str = "") -> T:
    """``cls`` (a dataclass) from ``data``, a JSON object."""
    return typing.cast(T, _dataclass(cls, data, where))


def encode(obj: object) -> Any:
    """A dataclass (and whatever it holds) as JSON values; its ``extra`` merged in."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        doc = _encode(obj)
        extra = doc.pop(EXTRA, None) if _has_extra(type(obj)) else None
        return {**doc, **(extra or {})}
    return _encode(obj)


def write_json(obj: object, path: Path) -> Path:
    """``obj`` as one JSON object at ``path``, its folder made first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(encode(obj)))
    return path


def read_json(cls: type[T], path: Path) -> T:
    """What ``write_json`` wrote, decoded as ``cls``."""
    path = Path(path)
    return decode(cls, json.loads(path.read_text()), path.name)


def shallow(obj: object) -> dict[str, Any]:
    """A dataclass's own fields, their values as they are (tensors too)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"{type(obj).__name__} is not a dataclass instance")
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _encode(obj: object) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


@functools.cache
def _has_extra(cls: type) -> bool:
    return any(f.name == EXTRA for f in dataclasses.fields(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _fail(where: str, message: str) -> DecodeError:
    return DecodeError(f"{where}: {message}" if where else message)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _dataclass(cls: type, data: object, where: str) -> object:
    if not isinstance(data, Mapping):
        raise _fail(where, f"{cls.__name__} expects an object, got {_kind(data)}")
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name != EXTRA]
    known = {f.name for f in fields}
    for f in fields:
        if (f.name not in data and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise _fail(where, f"{cls.__name__} lacks key {f.name!r}")
    unknown = [k for k in data if k not in known]
    kwargs = {k: _value(hints[k], data[k], _at(where, k)) for k in data if k in known}
    if _has_extra(cls):
        own = data.get(EXTRA)  # a nested object's extra, under its own key
        kwargs[EXTRA] = {**{k: data[k] for k in unknown if k != EXTRA or
                            not isinstance(own, Mapping)},
                         **(own if isinstance(own, Mapping) else {})}
    elif unknown:
        raise _fail(where, f"{cls.__name__} has no key {unknown[0]!r}")
    return cls(**kwargs)


def _value(hint: Any, value: Any, where: str) -> Any:
    if hint is Any or hint is object or isinstance(hint, TypeVar):
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(args, value, where)
    if origin is typing.Literal:
        if value not in args:
            raise _fail(where, f"{value!r} is not one of {list(args)}")
        return value
    if value is None:
        if hint is float:  # JSON has no NaN: the writer stores it as null
            return math.nan
        raise _fail(where, f"null where {_name(hint)} is expected")
    if dataclasses.is_dataclass(hint):
        return _dataclass(typing.cast(type, hint), value, where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise _fail(where, f"{value!r} is not a {hint.__name__}") from None
    if origin is not None:
        return _generic(origin, args, value, where)
    return _plain(hint, value, where)


def _union(args: tuple[Any, ...], value: Any, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    errors = []
    for option in inner:
        try:
            return _value(option, value, where)
        except DecodeError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    raise _fail(where, f"{_kind(value)} fits none of {', '.join(map(_name, inner))}")


def _generic(origin: Any, args: tuple[Any, ...], value: Any, where: str) -> Any:
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise _fail(where, f"expects a list, got {_kind(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise _fail(where, f"expects {len(args)} items, got {len(value)}")
            return tuple(_value(a, v, _at(where, i))
                         for i, (a, v) in enumerate(zip(args, value, strict=True)))
        item = args[0] if args else Any
        items = [_value(item, v, _at(where, i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _fail(where, f"expects an object, got {_kind(value)}")
        key, item = args if args else (Any, Any)
        return {_key(key, k, where): _value(item, v, _at(where, str(k)))
                for k, v in value.items()}
    return value  # another generic (a callable, a class): not a file's


def _key(hint: Any, key: Any, where: str) -> Any:
    """JSON keys are strings: an int-keyed dict's keys come back as ints."""
    if hint is int and isinstance(key, str):
        try:
            return int(key)
        except ValueError:
            raise _fail(where, f"key {key!r} is not an int") from None
    return key


def _plain(hint: Any, value: Any, where: str) -> Any:
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise _fail(where, f"expects a float, got {_kind(value)}")
    if hint is int and isinstance(value, bool):
        raise _fail(where, "expects an int, got bool")
    if hint in (dict, list) and not isinstance(value, hint):
        raise _fail(where, f"expects {'an object' if hint is dict else 'a list'}, "
                           f"got {_kind(value)}")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _fail(where, f"expects {_name(hint)}, got {_kind(value)}")
    return value


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)

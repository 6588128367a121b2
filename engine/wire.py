"""msgpack encoding of the engine's interface types, for an engine in its own process (server/engine_process.py).

A dataclass travels as the list of its fields' values in declaration order; each value is decoded back by its
field's type (enums by value, Path as text, tuples and lists of their items, X | None), so what arrives equals what
was sent and the codec follows the types as fields are added. Both ends run the same code (one installed package).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgpack

T = TypeVar("T")


def _plain(value: Any) -> Any:
    """A value as msgpack carries it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [_plain(getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


_decoders: dict[Any, Callable[[Any], Any]] = {}


def _decoder(tp: Any) -> Callable[[Any], Any]:
    """The function that turns msgpack's form of a `tp` back into one (made once per type)."""
    if tp not in _decoders:
        _decoders[tp] = _make_decoder(tp)
    return _decoders[tp]


def _make_decoder(tp: Any) -> Callable[[Any], Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        parts = [(f.name, _decoder(hints[f.name])) for f in dataclasses.fields(tp)]

        def dataclass_(v):
            if len(v) != len(parts):
                raise ValueError(f"{tp.__name__}: {len(v)} fields, expected {len(parts)}")
            return tp(**{name: dec(x) for (name, dec), x in zip(parts, v)})
        return dataclass_
    if origin in (typing.Union, types.UnionType):
        options = [(a, _decoder(a)) for a in args if a is not type(None)]
        if len(options) == 1:
            dec = options[0][1]
            return lambda v: None if v is None else dec(v)
        # Path | tuple[str, ...] style unions do not occur in the interface; the first option that fits decodes
        return lambda v: None if v is None else _first_fit(options, v)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _decoder(args[0])
            return lambda v: tuple(item(x) for x in v)
        items = [_decoder(a) for a in args]
        return lambda v: tuple(dec(x) for dec, x in zip(items, v, strict=True))
    if origin is list:
        item = _decoder(args[0]) if args else (lambda x: x)
        return lambda v: [item(x) for x in v]
    if origin is dict or tp is dict:
        return lambda v: v  # free-form facts (EngineInfo's model_info, languages): msgpack keeps maps and lists
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if tp is Path:
        return Path
    if tp is float:
        return float  # an int given for a float field arrives as the float it stands for
    if tp in (int, str, bool, bytes, Any, object):
        return lambda v: v
    raise TypeError(f"no wire form for {tp!r}")


def _first_fit(options, v):
    for tp, dec in options:
        if isinstance(tp, type) and isinstance(v, tp):
            return dec(v)
    return options[0][1](v)


def dumps(value: Any) -> bytes:
    return msgpack.packb(_plain(value), use_bin_type=True)


def loads(tp: type[T], data: bytes) -> T:
    return _decoder(tp)(msgpack.unpackb(data, raw=False, strict_map_key=False))

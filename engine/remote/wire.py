"""msgpack encoding of the engine's interface types, for an engine in its own process (engine/remote/engine_process.py).

A dataclass travels as the list of its fields' values in declaration order; each value is decoded back by its
field's type (enums by value, Path as text, tuples and lists of their items, X | None), so what arrives equals what
was sent and the codec follows the types as fields are added. Both ends run the same code (one installed package).

Decoding checks every value against its field's type (an int field takes an int, never a bool or a string; a
dataclass its exact number of fields; an enum one of its values): a malformed message, whatever its bytes (truncated
msgpack, wrong types, wrong shapes), raises WireError and nothing else, so a reader can drop it and live on.
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

# The protocol's message kinds (engine_process.py's docstring has the table): the first frame of each message.
HELLO, ADD, ABORT, REPORT, STOP, STOPPED, BYE = b"H", b"A", b"X", b"R", b"S", b"D", b"B"
PING, BEAT = b"P", b"K"  # a front end asks whether the engine is alive; the engine answers between two steps

T = TypeVar("T")


class WireError(ValueError):
    """A message that is not a well-formed value of the type asked for."""


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
            if len(_checked(v, list, tp.__name__)) != len(parts):
                raise WireError(f"{tp.__name__}: {len(v)} fields, expected {len(parts)}")
            values = {}
            for (name, dec), x in zip(parts, v):
                try:
                    values[name] = dec(x)
                except WireError as e:
                    raise WireError(f"{tp.__name__}.{name}: {e}") from None
            try:
                return tp(**values)
            except (TypeError, ValueError) as e:  # its __post_init__'s own checks
                raise WireError(f"{tp.__name__}: {e}") from None
        return dataclass_
    if origin in (typing.Union, types.UnionType):
        options = [(a, _decoder(a)) for a in args if a is not type(None)]
        if len(options) == 1:
            dec = options[0][1]
            return lambda v: None if v is None else dec(v)
        # Path | tuple[str, ...] style unions do not occur in the interface; the first option that fits decodes
        return lambda v: None if v is None else _first_fit(options, v)
    if origin is tuple:
        return _tuple_decoder(args)
    if origin is list:
        item = _decoder(args[0]) if args else (lambda x: x)
        return lambda v: [item(x) for x in _checked(v, list, "list")]
    if origin is dict or tp is dict:  # free-form facts (EngineInfo's model_info, languages): maps and lists as sent
        return lambda v: _checked(v, dict, "map")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda v: _enum(tp, v)
    if tp is Path:
        return lambda v: Path(_checked(v, str, "path"))
    if tp is float:  # an int given for a float field arrives as the float it stands for
        return lambda v: float(_checked(v, (int, float), "float"))
    if tp in (int, str, bool, bytes):
        return lambda v: _checked(v, tp, tp.__name__)
    if tp in (Any, object):
        return lambda v: v
    raise TypeError(f"no wire form for {tp!r}")


def _checked(v: Any, kinds: type | tuple[type, ...], what: str) -> Any:
    """v itself, if it is one of kinds (a bool only where bool is asked for: msgpack's true is no int)."""
    if not isinstance(v, kinds) or (isinstance(v, bool) and kinds is not bool):
        raise WireError(f"{what} expected, got {type(v).__name__}")
    return v


def _enum(tp: type[enum.Enum], v: Any) -> enum.Enum:
    try:
        return tp(v)
    except ValueError:
        raise WireError(f"{v!r} is no {tp.__name__}") from None


def _tuple_decoder(args: tuple) -> Callable[[Any], Any]:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])
        return lambda v: tuple(item(x) for x in _checked(v, list, "tuple"))
    items = [_decoder(a) for a in args]

    def fixed(v):
        if len(_checked(v, list, "tuple")) != len(items):
            raise WireError(f"tuple of {len(v)} items, expected {len(items)}")
        return tuple(dec(x) for dec, x in zip(items, v, strict=True))
    return fixed


def _first_fit(options, v):
    for tp, dec in options:
        if isinstance(tp, type) and isinstance(v, tp):
            return dec(v)
    return options[0][1](v)


def dumps(value: Any) -> bytes:
    return msgpack.packb(_plain(value), use_bin_type=True)


def loads(tp: type[T], data: bytes) -> T:
    """The `tp` that data encodes; WireError for anything else (truncated or trailing bytes, wrong types or shapes)."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack's errors are ValueErrors, TypeErrors (unhashable keys) and its own
        raise WireError(f"not msgpack: {e}") from None
    return _decoder(tp)(value)

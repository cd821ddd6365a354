"""The typed YAML loader every specroll config goes through.

`load_config(path, cls, overrides)` reads a YAML file into the dataclass `cls`, with command-line `section.field=value`
overrides set on the file's data first (`with_overrides`: so they are checked as the file is). Each value is checked
against its field's type hint (nested dataclasses are sections and must be mappings; `X | None`, `Literal`, lists and
tuples are understood; a bool is never an int; an int or a numeric string such as PyYAML's `'3e-4'` is taken as a
float), unknown keys fail, and the dataclass's own `__post_init__` checks the ranges. Every failure is a `ConfigError`
(a `ValueError`) naming `section.field`, the value and what is allowed, so a typo or a wrong type never silently falls
back to a default or crashes after models are built.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that cannot be used as written: its file, or a field named by its dotted path."""


def load_config(path: str | Path, cls: type[T], overrides: Sequence[str] = ()) -> T:
    """Read a YAML file into the dataclass `cls` (an empty file gives the defaults), with `overrides`
    (`section.field=value`, `with_overrides`) on top; see the module doc."""
    data = read_yaml(path)
    return from_dict(cls, with_overrides(data, overrides) if overrides and isinstance(data, dict) else data)


def with_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`data` with each `section.field=value` of `overrides` set (a copy): the value read as YAML (`4`, `3e-4`,
    `null`, `[model, suffix]`, `{a: 1}`), sections made where missing. What the path or the value may be is
    then checked as the YAML's own (`from_dict`): an unknown field, a wrong type or a bad value is one
    `ConfigError` line naming `section.field`; an override that is not `path=value` is one too."""
    data = copy.deepcopy(data)
    for override in overrides:
        path, sep, text = override.partition("=")
        keys = path.strip().split(".")
        if not sep or not all(keys):
            raise ConfigError(f"override {override!r} is invalid: section.field=value (e.g. grpo.steps=4)")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {override!r} is invalid: its value is not YAML "
                              f"({' '.join(str(err).split())})") from err
        section = data
        for depth, key in enumerate(keys[:-1]):
            inner = section.setdefault(key, {})
            if not isinstance(inner, dict):
                raise ConfigError(f"override {override!r} is invalid: {'.'.join(keys[: depth + 1])} is "
                                  f"{inner!r}, not a section")
            section = inner
        section[keys[-1]] = value
    return data


def read_yaml(path: str | Path) -> Any:
    """The file's YAML ({} when empty); an unreadable file or bad YAML is a `ConfigError` naming `path`.
    Imports nothing heavy: a job checks its file with it before loading torch."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from err
    return {} if data is None else data


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build the dataclass `cls` from a mapping, each value typed by its field (see the module doc)."""
    label = where or cls.__name__
    if not isinstance(data, dict):
        hint = f" (an emptied section: write `{label}: {{}}` for the defaults)" if data is None else ""
        raise ConfigError(f"{label}={data!r} is invalid: a mapping of {cls.__name__} fields{hint}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise ConfigError(f"{label} has unknown fields {unknown}; allowed: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _typed(hints[name], value, f"{where}.{name}" if where else name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:
        # `__post_init__` checks name their field, some with the section already (`grpo.steps`).
        message = str(err)
        raise ConfigError(message if not where or message.startswith(f"{where}.") else f"{where}: {message}") from err


def _typed(hint: Any, value: Any, where: str) -> Any:
    """`value` as the type `hint` allows it, or a `ConfigError` naming `where`, the value and what is allowed."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_dict(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _typed(arg, value, where)
            except ConfigError:
                continue
    elif origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in args):
            return value
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            key_hint, value_hint = args or (Any, Any)
            return {_typed(key_hint, k, f"{where} key"): _typed(value_hint, v, f"{where}.{k}")
                    for k, v in value.items()}
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return origin(_typed(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):
        return value
    raise ConfigError(f"{where}={value!r} is invalid: {_describe(hint)}")


def _describe(hint: Any) -> str:
    """What a type hint allows, in the words of a config error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is Literal:
        return " or ".join(repr(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list (each {_describe(args[0])})"
    if origin is dict or hint is dict:
        return "a mapping"
    names = {bool: "true or false", int: "an int", float: "a number", str: "a string", type(None): "null"}
    return names.get(hint, f"a {getattr(hint, '__name__', hint)}")

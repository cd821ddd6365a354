"""Optional extras: whether a module an extra brings is installed, and the one line that says how to get it.

    require({"trl": ("trl", "datasets"), "ray": ("ray",)}, "specroll train")   # or MissingExtra:
    # "specroll train needs trl, datasets, ray, not installed here: pip install "specroll[trl,ray]""

`pip install specroll` brings the engine; TRL, Ray, matplotlib (the report's plots) and ninja / setuptools (the
CPU paged-attention kernel's build) come with the extras of pyproject.toml (`trl`, `ray`, `report`, `kernel`).
A use of one that is not installed fails before any work with `MissingExtra` — a `ModuleNotFoundError` whose
message is the `pip install "specroll[<extra>]"` line (the CLI prints it alone, exit code 2) — instead of a raw
import error deep in a traceback. Standard library only: every layer may ask.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence


class MissingExtra(ModuleNotFoundError):
    """A module of an optional extra is not installed; the message is the one-line fix."""


def missing(modules: Sequence[str]) -> list[str]:
    """The `modules` (top-level names) that cannot be imported here (not installed, or blocked with
    `sys.modules[name] = None`)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def hint(needs: Mapping[str, Sequence[str]], needed_for: str) -> str | None:
    """The one line naming what `needed_for` lacks of `needs` (extra → its modules) and the extras that bring it;
    None when nothing lacks."""
    lacking = {extra: missing(modules) for extra, modules in needs.items()}
    lacking = {extra: modules for extra, modules in lacking.items() if modules}
    if not lacking:
        return None
    names = ", ".join(name for modules in lacking.values() for name in modules)
    return f'{needed_for} needs {names}, not installed here: pip install "specroll[{",".join(lacking)}]"'


def require(needs: Mapping[str, Sequence[str]], needed_for: str) -> None:
    """Raise `MissingExtra` (its message `hint`'s line) unless every module of `needs` is installed."""
    line = hint(needs, needed_for)
    if line is not None:
        raise MissingExtra(line)

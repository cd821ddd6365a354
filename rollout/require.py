"""The project's config check, shared by every settings dataclass (`require`)."""

from __future__ import annotations


def require(ok: bool, name: str, value: object, allowed: str) -> None:
    """The project's config check: `ValueError` naming the field, its value and what is allowed."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")

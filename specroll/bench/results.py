"""The JSON file a benchmark writes after every finished cell: an interrupted run keeps what it measured."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    """Replace `path` with `data` at once (a temporary sibling renamed), so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=2))
    os.replace(staging, path)

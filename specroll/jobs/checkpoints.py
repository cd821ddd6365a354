"""specroll's state beside a trainer checkpoint, on disk: written all or nothing, found, read back checked.

    write_saved_run(checkpoint_dir, run, backend_state)     # from `resume.ResumeCallback.on_save`
    saved = read_saved_run(find_checkpoint("specroll_report"))  # the newest whole checkpoint of a run folder

TRL writes a checkpoint as `<report.out_dir>/trainer/checkpoint-<step>/` (the policy, its optimizer and
scheduler, the trainer's RNG states and `trainer_state.json` with the log history); specroll's state goes in
its `specroll/` folder: `run.json` (what `resume.capture` keeps of the run: plain data) and `backend.pt` (the
rollout service's `state_dict()`: the learner's weights, optimizer, buffer..., `online_drafter.state.checkpoint`'s
format). The folder is written as a temporary sibling, every file synced to disk, then renamed into place
and the parent synced: TRL writes its own files before it calls `on_save`, so a checkpoint with a
`specroll/run.json` is whole, and one without it (a run killed while saving) is skipped with a line saying so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specroll.integrations.yaml_config import ConfigError
from specroll.online_drafter.state.checkpoint import load_checkpoint, save_checkpoint

logger = logging.getLogger(__name__)

SPECROLL_DIR = "specroll"
RUN_FILE = "run.json"
BACKEND_FILE = "backend.pt"
PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR
FORMAT = 1  # run.json's layout; another is refused


@dataclass
class SavedRun:
    """A whole checkpoint: its folder (what `trainer.train(resume_from_checkpoint=...)` takes), its step, and
    `run` (run.json). `backend_state()` reads backend.pt (it may be large: read once, when restoring)."""

    path: Path
    step: int
    run: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        """The run's report folder (`report.out_dir`): two levels above `trainer/checkpoint-<step>`."""
        return self.path.parent.parent

    def backend_state(self) -> dict[str, Any]:
        return load_checkpoint(self.path / SPECROLL_DIR / BACKEND_FILE, ("learner", "total_rollouts"))


def write_saved_run(checkpoint: str | os.PathLike, run: dict[str, Any], backend_state: dict[str, Any]) -> Path:
    """Write `checkpoint/specroll/` all or nothing (see the module doc); returns its path."""
    checkpoint = Path(checkpoint)
    final = checkpoint / SPECROLL_DIR
    for stale in checkpoint.glob(f".{SPECROLL_DIR}.*.tmp"):  # left by a run killed while writing this one
        shutil.rmtree(stale, ignore_errors=True)
    tmp = checkpoint / f".{SPECROLL_DIR}.{os.getpid()}.tmp"
    tmp.mkdir()
    try:
        save_checkpoint(backend_state, tmp / BACKEND_FILE)
        with open(tmp / RUN_FILE, "w") as f:
            json.dump({"format": FORMAT, **run}, f)
            f.flush()
            os.fsync(f.fileno())
        _sync_dir(tmp)
        if final.exists():  # a checkpoint of this step written before (a run resumed from an earlier one)
            old = checkpoint / f".{SPECROLL_DIR}.{os.getpid()}.old"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        _sync_dir(checkpoint)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def find_checkpoint(path: str | os.PathLike) -> SavedRun:
    """The checkpoint at `path` (a `checkpoint-<step>` folder), or the newest whole one of the run folder at
    `path` (its `trainer/checkpoint-*`), read (`read_saved_run`). Skipped incomplete ones are printed; none
    whole is a `ConfigError` naming `path` and what it holds."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"--resume {path}: no such folder (a run's report folder, or one of its "
                          "trainer/checkpoint-<step> folders)")
    if path.name.startswith(PREFIX):
        return read_saved_run(path)
    folders = sorted((p for p in (path / "trainer").glob(f"{PREFIX}*") if p.name[len(PREFIX):].isdigit()),
                     key=lambda p: int(p.name[len(PREFIX):]), reverse=True)
    for folder in folders:
        if (folder / SPECROLL_DIR / RUN_FILE).is_file():
            return read_saved_run(folder)
        logger.info(f"specroll train: skipping {folder}: incomplete (no {SPECROLL_DIR}/{RUN_FILE}: the run was stopped "
              "while saving it)")
    found = f"{len(folders)} incomplete checkpoints" if folders else "no trainer/checkpoint-<step> folder"
    raise ConfigError(f"--resume {path}: no whole checkpoint to resume from ({found}; a run saves them with "
                      "checkpoint.every > 0)")


def read_saved_run(checkpoint: str | os.PathLike) -> SavedRun:
    """The checkpoint folder's specroll state; a folder without it, or of another format, is a `ConfigError`."""
    checkpoint = Path(checkpoint)
    run_file = checkpoint / SPECROLL_DIR / RUN_FILE
    if not run_file.is_file():
        raise ConfigError(f"--resume {checkpoint}: no {SPECROLL_DIR}/{RUN_FILE} there (not a whole specroll "
                          "checkpoint: a run stopped while saving it, or a checkpoint TRL wrote alone)")
    try:
        run = json.loads(run_file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"--resume {checkpoint}: {run_file} is not readable JSON ({err})") from err
    if run.get("format") != FORMAT:
        raise ConfigError(f"--resume {checkpoint}: {run_file} has format {run.get('format')!r}; this specroll "
                          f"reads format {FORMAT}")
    return SavedRun(checkpoint, int(run["step"]), run)


def _sync_dir(path: Path) -> None:
    """fsync a folder: a rename or a new file in it is on disk once this returns."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""specroll's messages: every module logs through `logging.getLogger(__name__)` ("specroll.<module>").

    import logging
    logger = logging.getLogger(__name__)
    logger.info("specroll train: ...")

As transformers does for "transformers", the library's root logger "specroll" gets one handler of its own on first
import (`specroll/__init__.py`): messages as they are written (no prefix: each says who speaks), from INFO up, info to
`sys.stdout` and warnings to `sys.stderr` — where `print` put them before, so a run's output reads the same. A user
turns it up or down as with transformers and TRL: `set_verbosity(logging.WARNING)`, `SPECROLL_VERBOSITY=warning` (debug,
info, warning, error), or `specroll --quiet` / `--verbose`; `logging.getLogger("specroll").propagate` decides whether
the application's own handlers see them too (off by default: one line per message). Warnings stay `warnings.warn` (once
per place, filterable) and progress bars stay tqdm.
"""

from __future__ import annotations

import logging
import os
import sys

LIBRARY = "specroll"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ENV = "SPECROLL_VERBOSITY"


class _ConsoleHandler(logging.Handler):
    """Messages below WARNING to the current `sys.stdout`, the rest to the current `sys.stderr` (read when a message
    is emitted: pytest's capture, a redirect), each through `tqdm.write`: on a line of its own under a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            tqdm = sys.modules.get("tqdm")  # no progress bar shows unless tqdm is loaded: never load it for one
            if tqdm is not None:
                tqdm.tqdm.write(self.format(record), file=stream)
            else:
                stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's contract: a failed emit is reported by handleError, never raised
            self.handleError(record)


def configure() -> None:
    """Give the "specroll" logger its handler and level (`SPECROLL_VERBOSITY`, default info), once."""
    root = logging.getLogger(LIBRARY)
    if any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        return
    handler = _ConsoleHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.propagate = False
    name = os.environ.get(ENV, "info").lower()
    if name not in LEVELS:
        raise ValueError(f"{ENV}={name!r} is invalid: one of {sorted(LEVELS)}")
    root.setLevel(LEVELS[name])


def set_verbosity(level: int) -> None:
    """The lowest level of message specroll shows (`logging.DEBUG` … `logging.ERROR`)."""
    logging.getLogger(LIBRARY).setLevel(level)

"""specroll: speculative-decoding rollouts with online draft learning for RL on language models."""

from specroll.log import configure as _configure_logging

__version__ = "0.1.0"

_configure_logging()

"""specroll: speculative-decoding rollouts with online draft learning for RL on language models."""

__version__ = "0.1.0"

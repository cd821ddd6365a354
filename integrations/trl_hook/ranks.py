"""AccelerateRanks: the trainer's processes as `accelerate` sees them, for the shared Ray service.

    controller = shared_controller(config, AccelerateRanks())   # under accelerate launch / torchrun

Uses accelerate's `PartialState` (it sets up the default process group from the launcher's
environment, as the trainer will: gloo on CPU, NCCL on GPU), so it can run before the trainer exists.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


class AccelerateRanks:
    """Implements `ray_backend.shared_service.RankGroup` over accelerate's process group."""

    def __init__(self, cpu: bool = False, deepspeed: bool = False) -> None:
        """`cpu`: the trainer runs on CPU (`TrainingArguments(use_cpu=True)`; gloo); `deepspeed`: it runs
        DeepSpeed (`TrainingArguments(deepspeed=...)`). Accelerate needs both before it sets the process
        group up; `deepspeed` is told it the way `TrainingArguments` tells it (`ACCELERATE_USE_DEEPSPEED`
        while the state is made)."""
        from accelerate import PartialState

        told = deepspeed and "ACCELERATE_USE_DEEPSPEED" not in os.environ
        if told:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        try:
            self.state = PartialState(cpu=cpu)
        finally:
            if told:
                del os.environ["ACCELERATE_USE_DEEPSPEED"]

    @property
    def is_main(self) -> bool:
        return self.state.is_main_process

    @property
    def rank(self) -> int:
        return self.state.process_index

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    def broadcast(self, value: Any) -> Any:
        if self.state.num_processes == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self.state.wait_for_everyone()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """The main rank runs the block first (e.g. builds a cache), then the others."""
        with self.state.main_process_first():
            yield

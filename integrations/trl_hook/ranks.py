"""AccelerateRanks: the trainer's processes as `accelerate` sees them, for the shared Ray service.

    controller = shared_controller(config, AccelerateRanks())   # under accelerate launch / torchrun

Uses accelerate's `PartialState` (it sets up the default process group from the launcher's
environment, as the trainer will: gloo on CPU, NCCL on GPU), so it can run before the trainer exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class AccelerateRanks:
    """Implements `ray_backend.shared_service.RankGroup` over accelerate's process group."""

    def __init__(self, cpu: bool = False) -> None:
        """`cpu`: the trainer runs on CPU (`TrainingArguments(use_cpu=True)`; gloo), as accelerate needs to know
        before it sets the process group up."""
        from accelerate import PartialState

        self.state = PartialState(cpu=cpu)

    @property
    def is_main(self) -> bool:
        return self.state.is_main_process

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

"""AccelerateRanks: the trainer's processes as `accelerate` sees them, for the shared Ray service.

    controller = shared_controller(config, AccelerateRanks())   # under accelerate launch / torchrun

Uses accelerate's `PartialState` (it sets up the default process group from the launcher's
environment, as the trainer will: gloo on CPU, NCCL on GPU), so it can run before the trainer exists.
"""

from __future__ import annotations

from typing import Any


class AccelerateRanks:
    """Implements `ray_backend.shared_service.RankGroup` over accelerate's process group."""

    def __init__(self) -> None:
        from accelerate import PartialState

        self.state = PartialState()

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

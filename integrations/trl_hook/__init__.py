"""specroll as TRL's `GRPOTrainer(rollout_func=...)` hook (`rollout_func`) and the policy's weights
gathered for a sync from plain, PEFT or DeepSpeed ZeRO-3 models (`policy_sync`); the trainer's ranks under
`accelerate launch` for the shared Ray service (`ranks`); the policy update over length-grouped rows
(`length_groups`)."""

from .length_groups import LengthGroupedLogps, length_grouped
from .rollout_func import PolicySyncCallback, SpecrollRolloutFunc

__all__ = ["LengthGroupedLogps", "PolicySyncCallback", "SpecrollRolloutFunc", "length_grouped"]

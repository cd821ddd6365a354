"""specroll as TRL's `GRPOTrainer(rollout_func=...)` hook (`rollout_func`) and the policy's weights
gathered for a sync from plain, PEFT or DeepSpeed ZeRO-3 models (`policy_sync`)."""

from .rollout_func import PolicySyncCallback, SpecrollRolloutFunc

__all__ = ["PolicySyncCallback", "SpecrollRolloutFunc"]

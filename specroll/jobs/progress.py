"""The GRPO progress bar of `specroll train`: one tqdm bar over the steps, showing reward, rollout tokens/s,
acceptance and the drafter version as TRL logs them, and the last logged numbers as one JSON line at the end."""

from __future__ import annotations

import json
from typing import Any


def progress_bar() -> Any:
    """One tqdm bar over GRPO steps with reward, rollout tokens/s and acceptance as they are logged."""
    from transformers import TrainerCallback

    class ProgressBar(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, desc="GRPO", unit="step", disable=not state.is_world_process_zero)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero:  # one bar and one summary line per run, from the main rank
                return
            logs = logs or {}
            shown = {"reward": "reward", "rollout/tokens_per_s": "tok/s", "rollout/acceptance_rate": "accept",
                     "drafter/version": "drafter", "drafter/speculating": "spec"}
            self.bar.set_postfix({label: f"{logs[k]:.3g}" for k, label in shown.items() if logs.get(k) is not None})
            self.bar.n = state.global_step
            self.bar.refresh()

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()
            if state.log_history and state.is_world_process_zero:
                print(json.dumps({k: v for k, v in state.log_history[-1].items() if isinstance(v, (int, float))}))

    return ProgressBar()

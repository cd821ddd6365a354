"""Where the online learner's signals come from (`LearnerConfig.signals`), and what the source must record.

The learner trains on the target's top-k processed probabilities at every completion position and, for a head that
reads the target's features, the hidden states it reads (`RolloutSignals`). Three sources can give them:

- "engine": specroll's engine records them during verification, for free (`EngineConfig.record_signals`);
- "trainer": TRL's GRPO loss forward runs the policy over every rollout anyway; specroll's TRL hook captures them
  there (`trl_hook.signal_capture`) and hands the rollouts to the learner once that step's forward ran — zero extra
  target forwards, as NeMo-RL, verl-SpeCo and SkyRL do;
- "forward": an extra forward of a policy copy over every rollout (`vllm.signals.TargetSignals`), for an engine that
  records none (vLLM) when no trainer forward is at hand.

    source = resolve_source(config.learner.signals, "vllm")     # "auto" → "forward" on vLLM
    request = SignalRequest(top_k=16, hidden=True, capture_layers=(1, 4, 7))   # what a source records
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specroll.rollout import SamplingParams
from specroll.rollout.sampling.logits import process_logits

ENGINE_SOURCES = {"specroll": ("engine", "trainer"), "vllm": ("trainer", "forward")}  # engine kind → sources it takes
AUTO = {"specroll": "engine", "vllm": "forward"}


@dataclass(frozen=True)
class SignalRequest:
    """What a signal source records per rollout: the target's top-`top_k` processed probabilities at each completion
    position and, with `hidden`, the hidden states at every position but the last — the final-normed last layer, or
    (`capture_layers`, EAGLE-3 / DFlash) the residual stream entering those decoder layers, concatenated, as the
    engine records them (`ModelRunner.capture_hidden`)."""

    top_k: int
    hidden: bool = False
    capture_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"signal_top_k={self.top_k!r} is invalid: an int >= 1")
        if self.capture_layers is not None and not self.hidden:
            raise ValueError(f"capture_layers={self.capture_layers} is invalid without hidden=True: the layers name "
                             "which hidden states to record")


def resolve_source(signals: str, engine_kind: str) -> str:
    """The source `learner.signals` names on `engine_kind` ("auto" resolved); ValueError naming the field where that
    engine cannot give it."""
    allowed = ENGINE_SOURCES[engine_kind]
    source = AUTO[engine_kind] if signals == "auto" else signals
    if source not in allowed:
        why = "vLLM records no per-position distributions" if engine_kind == "vllm" else \
            "specroll's engine records them during verification at no cost"
        raise ValueError(f"learner.signals={signals!r} is invalid with engine.kind: {engine_kind} ({why}): one of "
                         f"{['auto', *allowed]}")
    return source


def signal_params(params: SamplingParams) -> SamplingParams:
    """The processing the recorded probabilities are under: the rollouts' own, or T = 1 for greedy rollouts (whose
    processed distribution is one-hot), as the engine records them."""
    return dataclasses.replace(params, temperature=1.0) if params.greedy else params


def top_k_signals(logits: torch.Tensor, params: SamplingParams, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-`top_k` ids [T, k] and processed probabilities [T, k] (fp32, on the CPU) of `logits` [T, V] under
    `signal_params(params)`."""
    top = process_logits(logits, signal_params(params)).topk(min(top_k, logits.shape[-1]), dim=-1)
    return top.indices.cpu(), top.values.float().cpu()

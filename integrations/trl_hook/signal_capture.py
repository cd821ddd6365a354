"""TrainerSignalCapture: the learner's signals taken from TRL's own GRPO loss forward over the rollouts.

`LearnerConfig.signals: trainer`. The GRPO loss runs the policy over every rollout (prompt + completion) anyway;
hooks on the policy's backbone keep, detached, what the online learner trains on (`signal_source.SignalRequest`):
the top-k processed probabilities at each completion position — the backbone's final-normed hidden states through
the policy's LM head, processed under the rollouts' sampling params exactly as the engine records them — and, for
a head, the hidden states it reads (fp16, as `RolloutSignals` keeps them). No extra target forward: the LM head
over the completion positions is all it adds (`seconds` measures it).

    capture = TrainerSignalCapture(backend.trainer_signals())
    capture.attach(trainer)                      # wraps trainer.compute_loss
    capture.expect(rollouts, params, step)       # the rollouts a training call returned
    ...                                          # TRL's loss forward runs over them
    backend.add_trainer_signals(capture.take())  # next call: those that arrived, with their signals

What TRL does to the rows, and why the capture holds:

- TRL 1.16 pads prompts on the left and completions on the right, shuffles a generation batch and splits it into
  `steps_per_generation` micro-batches; rows are matched to the expected rollouts by their tokens (the attention
  mask marks them), so order and batching do not matter. Siblings with identical tokens get identical signals.
- Only forwards of the rollouts' own policy are kept: the loss forward while `trainer.state.global_step` is still the
  step that generated them. Gradient accumulation runs every micro-batch of a generation before the optimizer step;
  `num_iterations > 1` forwards the same rows again after updates: those (and the evaluation loop's) are not taken.
  `steps_per_generation > gradient_accumulation_steps` would put an optimizer step between a generation's micro-
  batches and lose their signals: refused at `attach`. The reference model's forward is never hooked: TRL runs it
  outside `compute_loss`.
- A row whose completion TRL masked from attention (`mask_truncated_completions`) matches no rollout: its rollout
  is never handed to the learner (`missed`), as are rows cut by TRL's own truncation.
- Under DeepSpeed ZeRO-3 the LM head is gathered for the projection (TRL's `maybe_gather_lm_head_ctx`, a collective:
  every rank enters it once per hooked forward, matched rows or not); under PEFT the hooks sit on the adapted
  model's backbone, so the signals are the adapted policy's. Refused: Liger's fused loss (no backbone forward
  through the model), models whose logits are not the LM head's output (`final_logit_softcapping`, `logit_scale`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import is_peft_model

from specroll.integrations.signal_source import SignalRequest, top_k_signals
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.request import RolloutSignals

HIDDEN_DTYPE = torch.float16  # as `RolloutSignals.hidden` documents
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale")  # config fields whose logits are not lm_head(h)

TokenKey = tuple[tuple[int, ...], tuple[int, ...]]


class TrainerSignalCapture:
    """Captures `RolloutSignals` for expected rollouts in the trainer's loss forward (see the module doc)."""

    def __init__(self, request: SignalRequest):
        self.request = request
        self.seconds = 0.0  # spent capturing, all forwards together (what the signals cost on top of the loss)
        self.handed = 0  # rollouts `take` returned, all calls together
        self.missed = 0  # expected rollouts no loss forward covered (`take` forgot them)
        self._expected: list[Rollout] = []
        self._by_tokens: dict[TokenKey, list[int]] = {}
        self._captured: dict[int, RolloutSignals] = {}
        self._params: SamplingParams | None = None
        self._version: int | None = None

    def attach(self, trainer: Any) -> None:
        """Wrap `trainer.compute_loss` so that its forward is watched while expected rollouts wait. Raises ValueError
        naming the trainer setting the capture cannot work under."""
        check_trainer(trainer)
        original = trainer.compute_loss

        def compute_loss(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            if not self._waiting(trainer):
                return original(model, inputs, *args, **kwargs)
            with self.watching(trainer.accelerator.unwrap_model(trainer.model), inputs["prompt_ids"].shape[1]):
                return original(model, inputs, *args, **kwargs)

        trainer.compute_loss = compute_loss

    def expect(self, rollouts: list[Rollout], params: SamplingParams, version: int) -> None:
        """The rollouts a training call returned (generated under `params` by policy `version`): their signals are
        taken from the next loss forwards of that policy. Rollouts of an earlier call that `take` did not return are
        forgotten, captured or not (counted in `missed`)."""
        self.missed += len(self._expected)
        self._captured = {}
        self._expected = list(rollouts)
        self._params, self._version = params, version
        self._by_tokens = {}
        for i, r in enumerate(rollouts):
            self._by_tokens.setdefault(_key(r.prompt_ids, r.completion_ids), []).append(i)

    def take(self) -> list[Rollout]:
        """The expected rollouts whose signals arrived, in the order they were expected, each a copy carrying them;
        the others are forgotten (`missed`)."""
        arrived = [dataclasses.replace(r, signals=self._captured[i]) for i, r in enumerate(self._expected)
                   if i in self._captured]
        self.missed += len(self._expected) - len(arrived)
        self.handed += len(arrived)
        self._expected, self._by_tokens, self._captured = [], {}, {}
        return arrived

    @contextmanager
    def watching(self, model: torch.nn.Module, prompt_width: int) -> Iterator[None]:
        """Hooks on `model` (the trainer's policy, unwrapped; PEFT or not) for the forwards inside: rows are
        `prompt_width` prompt columns (left-padded) then the completion (right-padded), as TRL's loss builds them."""
        causal = model.get_base_model() if is_peft_model(model) else model
        backbone = causal.base_model  # what TRL's fused LM head runs (`trl.trainer.utils.add_fused_lm_head`)
        layer_inputs: dict[int, torch.Tensor] = {}
        handles = []
        for layer in self.request.capture_layers or ():
            handles.append(backbone.layers[layer].register_forward_pre_hook(_keep_input(layer_inputs, layer),
                                                                            with_kwargs=True))

        def on_backbone(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            started = time.perf_counter()
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._record(ids, kwargs["attention_mask"], output.last_hidden_state, layer_inputs, prompt_width,
                         causal.get_output_embeddings())
            layer_inputs.clear()
            self.seconds += time.perf_counter() - started

        handles.append(backbone.register_forward_hook(on_backbone, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _waiting(self, trainer: Any) -> bool:
        """Whether this loss forward is of the expected rollouts' policy. Not whether any still wait: under ZeRO-3 the
        LM head's gather is collective, so every rank must watch the same forwards whatever its own rows matched."""
        return bool(self._expected) and trainer.model.training and self._version == trainer.state.global_step

    @torch.no_grad()
    def _record(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, last_hidden: torch.Tensor,
                layer_inputs: dict[int, torch.Tensor], prompt_width: int, lm_head: torch.nn.Module) -> None:
        """Signals for every row of one backbone forward that an expected, uncaptured rollout has."""
        from trl.trainer.utils import maybe_gather_lm_head_ctx

        real = attention_mask.bool().cpu()  # [b, L]
        tokens = input_ids.cpu()
        matched: list[tuple[int, list[int], int, int]] = []  # (row, rollout indices, prompt len, completion len)
        for row in range(tokens.shape[0]):
            prompt = tokens[row, :prompt_width][real[row, :prompt_width]].tolist()
            completion = tokens[row, prompt_width:][real[row, prompt_width:]].tolist()
            waiting = [i for i in self._by_tokens.get(_key(prompt, completion), ()) if i not in self._captured]
            if waiting and completion:
                matched.append((row, waiting, len(prompt), len(completion)))
        # [Σ T, H]: the states that predict each matched completion's tokens (position P - 1 + t predicts token t)
        states = [last_hidden[row, prompt_width - 1:prompt_width - 1 + steps] for row, _, _, steps in matched]
        weight, bias = lm_head.weight, lm_head.bias
        with maybe_gather_lm_head_ctx(weight, bias), torch.autocast(last_hidden.device.type, enabled=False):
            if not matched:
                return
            logits = F.linear(torch.cat(states).float(), weight.float(), None if bias is None else bias.float())
        ids, probs = top_k_signals(logits, self._params, self.request.top_k)
        start = 0
        for row, waiting, prompt_len, steps in matched:
            signals = RolloutSignals(
                topk_ids=ids[start:start + steps], topk_probs=probs[start:start + steps],
                draft_ids=torch.full((steps,), -1, dtype=torch.long), accepted=torch.zeros(steps, dtype=torch.bool),
                hidden=self._hidden(row, prompt_width - prompt_len, prompt_width + steps - 1, last_hidden,
                                    layer_inputs) if self.request.hidden else None)
            start += steps
            for i in waiting:
                self._captured[i] = signals

    def _hidden(self, row: int, first: int, end: int, last_hidden: torch.Tensor,
                layer_inputs: dict[int, torch.Tensor]) -> torch.Tensor:
        """[P + T - 1, H] (or [.., k·H]): row's states at every real position but the last, as the engine records."""
        layers = self.request.capture_layers
        picked = last_hidden[row, first:end] if layers is None else \
            torch.cat([layer_inputs[i][row, first:end] for i in layers], dim=-1)
        return picked.detach().to("cpu", HIDDEN_DTYPE)


def check_trainer(trainer: Any) -> None:
    """ValueError naming the first trainer setting under which the loss forward cannot give the learner's signals."""
    args = trainer.args
    if getattr(args, "use_liger_kernel", False):
        raise ValueError("GRPOConfig(use_liger_kernel=True) is invalid with learner.signals: trainer (Liger's fused "
                         "loss computes no hidden states through the model): set it False, or learner.signals: forward")
    if args.steps_per_generation > args.gradient_accumulation_steps:
        raise ValueError(f"GRPOConfig(steps_per_generation={args.steps_per_generation}) is invalid with "
                         "learner.signals: trainer: above gradient_accumulation_steps "
                         f"({args.gradient_accumulation_steps}) an optimizer step falls between a generation's "
                         "micro-batches, whose forward is then another policy's; at most gradient_accumulation_steps")
    model = trainer.accelerator.unwrap_model(trainer.model)
    text = model.config.get_text_config()
    for name in LOGIT_TRANSFORMS:
        if getattr(text, name, None) not in (None, 1.0):
            raise ValueError(f"{name}={getattr(text, name)!r} in the policy's config is invalid with learner.signals: "
                             "trainer (its logits are not the LM head's output, which the capture projects): use "
                             "learner.signals: engine or forward")


def _keep_input(store: dict[int, torch.Tensor], layer: int):
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        store[layer] = (args[0] if args else kwargs["hidden_states"]).detach()
    return hook


def _key(prompt_ids: list[int], completion_ids: list[int]) -> TokenKey:
    return tuple(map(int, prompt_ids)), tuple(map(int, completion_ids))

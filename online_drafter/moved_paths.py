"""Where pickled classes moved: the old → new module paths a learner recording's reader follows.

A recording (`recording.RecordingLearner`) pickles what the learner was given: rollouts and their signals
(`specroll.rollout` classes) and the drafter (a model or a head). Pickle names each class by its module
path, so a recording made before a module moved names a module that no longer exists. `MOVED_PATHS` maps
each old path to the one that holds the name now — a whole module (`"old.module": "new.module"`), or one
name that left its module or was renamed (`"old.module:Name": "new.module:NewName"`, which wins over its
module's line) — and `load_moved` reads a file through it. Issue 34 gave both packages a folder per concept:
its moves are listed here; a later move adds its lines (`rollout/` lists its own in the same form). Only a class
a recording pickles needs a line: the learner's own pieces (`gate/`, `state/`, the config: saved as a dict) never
are pickled, so their moves are not listed.
"""

from __future__ import annotations

import os
import pickle
import types
from typing import Any

import torch

MOVED_PATHS: dict[str, str] = {
    # online_drafter/: the drafter LM's and the heads' data, scorer and learner in lm/ and heads/
    "specroll.online_drafter.learner:DraftLearner": "specroll.online_drafter.lm.learner:DraftLearner",
    "specroll.online_drafter.buffer:DraftBuffer": "specroll.online_drafter.lm.data:DraftBuffer",
    "specroll.online_drafter.buffer:to_buffered": "specroll.online_drafter.lm.data:to_buffered",
    "specroll.online_drafter.draft_batch:length_batches": "specroll.online_drafter.batching:length_batches",
    "specroll.online_drafter.draft_batch": "specroll.online_drafter.lm.data",
    "specroll.online_drafter.scoring:Loss": "specroll.online_drafter.scorer:Loss",
    "specroll.online_drafter.scoring": "specroll.online_drafter.lm.scorer",
    "specroll.online_drafter.head_buffer": "specroll.online_drafter.heads.data",
    "specroll.online_drafter.head_data": "specroll.online_drafter.heads.data",
    "specroll.online_drafter.head_scoring": "specroll.online_drafter.heads.scorer",
    "specroll.online_drafter.head_objectives": "specroll.online_drafter.heads.objectives",
    "specroll.online_drafter.head_learner": "specroll.online_drafter.heads.learner",
    # rollout/: core/, sampling/, models/, drafters/, gamma/
    "specroll.rollout.request": "specroll.rollout.core.request",
    "specroll.rollout.batch:FinishedRow": "specroll.rollout.core.request:FinishedRow",
    "specroll.rollout.batch": "specroll.rollout.core.batch",
    "specroll.rollout.scheduler": "specroll.rollout.core.scheduler",
    "specroll.rollout.stats": "specroll.rollout.core.stats",
    "specroll.rollout.validate": "specroll.rollout.core.validate",
    "specroll.rollout.append": "specroll.rollout.core.append",
    "specroll.rollout.randomness": "specroll.rollout.sampling.randomness",
    "specroll.rollout.sampling:process_logits": "specroll.rollout.sampling.logits:process_logits",
    "specroll.rollout.sampling:draw": "specroll.rollout.sampling.noise:gumbel_max",
    "specroll.rollout.sampling:StepNoise": "specroll.rollout.sampling.noise:StepNoise",
    "specroll.rollout.sampling:Verdict": "specroll.rollout.sampling.accept:Verdict",
    "specroll.rollout.sampling:Sampler": "specroll.rollout.sampling.accept:AcceptRule",
    "specroll.rollout.sampling:RejectionSampler": "specroll.rollout.sampling.accept:RejectionSampling",
    "specroll.rollout.sampling:InvariantSampler": "specroll.rollout.sampling.accept:InvariantSampling",
    "specroll.rollout.sampling:SAMPLERS": "specroll.rollout.sampling.accept:ACCEPT_RULES",
    "specroll.rollout.runner": "specroll.rollout.models.runner",
    "specroll.rollout.cache": "specroll.rollout.models.cache",
    "specroll.rollout.lean": "specroll.rollout.models.lean",
    "specroll.rollout.architectures": "specroll.rollout.models.architectures",
    "specroll.rollout.vocab": "specroll.rollout.models.vocab",
    "specroll.rollout.weights": "specroll.rollout.models.weights",
    "specroll.rollout.mixers": "specroll.rollout.models.mixers",
    "specroll.rollout.linear_state": "specroll.rollout.models.recurrent.linear_state",
    "specroll.rollout.gated_delta": "specroll.rollout.models.recurrent.gated_delta",
    "specroll.rollout.mamba": "specroll.rollout.models.recurrent.mamba",
    "specroll.rollout.cost_model:ForwardTimes": "specroll.rollout.models.timing:ForwardTimes",
    "specroll.rollout.cost_model:time_forwards": "specroll.rollout.models.timing:time_forwards",
    "specroll.rollout.cost_model:draft_noise": "specroll.rollout.models.timing:draft_noise",
    "specroll.rollout.cost_model:model_cost_key": "specroll.rollout.models.timing:model_cost_key",
    "specroll.rollout.cost_model:CALIBRATION_CONTEXT": "specroll.rollout.models.timing:CALIBRATION_CONTEXT",
    "specroll.rollout.cost_model:DRAFT_PARAMS": "specroll.rollout.models.timing:DRAFT_PARAMS",
    "specroll.rollout.cost_model": "specroll.rollout.gamma.cost_model",
    "specroll.rollout.drafter:time_host_drafts": "specroll.rollout.models.timing:time_host_drafts",
    "specroll.rollout.drafter:ModelDrafter": "specroll.rollout.drafters.model:ModelDrafter",
    "specroll.rollout.drafter": "specroll.rollout.drafters.protocol",
    "specroll.rollout.hidden:time_draft_calls": "specroll.rollout.models.timing:time_draft_calls",
    "specroll.rollout.hidden": "specroll.rollout.drafters.hidden",
    "specroll.rollout.drafter_factory": "specroll.rollout.drafters.factory",
    "specroll.rollout.suffix:PRIOR_ACCEPTANCE": "specroll.rollout.drafters.suffix:BUCKET_PRIORS",
    "specroll.rollout.suffix": "specroll.rollout.drafters.suffix",
    "specroll.rollout.suffix_index": "specroll.rollout.drafters.suffix_index",
    "specroll.rollout.layer_skip": "specroll.rollout.drafters.layer_skip",
    "specroll.rollout.eagle": "specroll.rollout.drafters.eagle",
    "specroll.rollout.medusa": "specroll.rollout.drafters.medusa",
    "specroll.rollout.heads": "specroll.rollout.drafters.heads",
    "specroll.rollout.multi_drafter:MultiDrafter": "specroll.rollout.drafters.suffix_or_model:SuffixOrModelDrafter",
    "specroll.rollout.multi_drafter:PRIOR_ACCEPTANCE": "specroll.rollout.core.rates:PRIOR_ACCEPTANCE",
    "specroll.rollout.multi_drafter": "specroll.rollout.drafters.suffix_or_model",
    "specroll.rollout.gamma:StepShape": "specroll.rollout.gamma.policy:StepShape",
    "specroll.rollout.gamma:StepOutcome": "specroll.rollout.gamma.policy:StepOutcome",
    "specroll.rollout.gamma:GammaPolicy": "specroll.rollout.gamma.policy:GammaPolicy",
    "specroll.rollout.gamma:FixedGamma": "specroll.rollout.gamma.policy:FixedGamma",
    "specroll.rollout.gamma:AutoGamma": "specroll.rollout.gamma.auto:AutoGamma",
    "specroll.rollout.gamma:STICK_WITHIN": "specroll.rollout.gamma.auto:STICK_WITHIN",
    "specroll.rollout.gamma:TRY_EVERY": "specroll.rollout.gamma.auto:TRY_EVERY",
    "specroll.rollout.gamma:TRY_WITHIN": "specroll.rollout.gamma.auto:TRY_WITHIN",
    "specroll.rollout.gamma:EXPLORE_EVERY": "specroll.rollout.gamma.auto:EXPLORE_EVERY",
    "specroll.rollout.gamma:EXPLORE_WITHIN": "specroll.rollout.gamma.auto:EXPLORE_WITHIN",
    "specroll.rollout.gamma:make_gamma_policy": "specroll.rollout.gamma.factory:make_gamma_policy",
    "specroll.rollout.gamma:break_even_acceptance": "specroll.rollout.gamma.break_even:break_even_acceptance",
    "specroll.rollout.gamma_rate:RateGamma": "specroll.rollout.gamma.simple:SimpleGamma",
    "specroll.rollout.gamma_rate:PRIOR_ACCEPTANCE": "specroll.rollout.core.rates:PRIOR_ACCEPTANCE",
    "specroll.rollout.gamma_rate:PRIOR_ROWS": "specroll.rollout.gamma.estimate:PRIOR_ROWS",
    "specroll.rollout.gamma_rate:SHRINK_ROWS": "specroll.rollout.gamma.estimate:SHRINK_ROWS",
    "specroll.rollout.gamma_rate": "specroll.rollout.gamma.simple",
    "specroll.rollout.acceptance:acceptance_counts": "specroll.rollout.core.append:acceptance_counts",
    "specroll.rollout.acceptance:PRIOR_ACCEPTANCE": "specroll.rollout.core.rates:PRIOR_ACCEPTANCE",
    "specroll.rollout.acceptance": "specroll.rollout.gamma.estimate",
    "specroll.rollout.break_even": "specroll.rollout.gamma.break_even",
}


def moved(module: str, name: str) -> tuple[str, str]:
    """Where `name` of `module` (as an old pickle names it) lives now: itself if it did not move."""
    target = MOVED_PATHS.get(f"{module}:{name}") or MOVED_PATHS.get(module)
    if target is None:
        return module, name
    new_module, _, new_name = target.partition(":")
    return new_module, new_name or name


class MovedPathsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(*moved(module, name))


# What `torch.load(pickle_module=...)` uses of a pickle module: its name, `Unpickler` and `load`.
_PICKLE = types.SimpleNamespace(__name__="pickle", Unpickler=MovedPathsUnpickler, load=pickle.load)


def load_moved(path: str | os.PathLike) -> Any:
    """`torch.load` of a file this code wrote (it unpickles objects: trusted files only), following
    `MOVED_PATHS` for classes that moved since."""
    return torch.load(path, weights_only=False, pickle_module=_PICKLE)

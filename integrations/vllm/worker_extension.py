"""specroll's methods on every vLLM worker, called through `LLM.collective_rpc`: load weights in place, and say
which drafter version the worker really serves.

vLLM imports this class by name in each worker process (`LLM(worker_extension_cls=...)`) and mixes it into its
worker, so `self` below is the worker (`self.model_runner.model` the target, `self.model_runner.drafter.model` the
proposer's model). Importing the module also repairs vLLM's CPU build in that process (`cpu_fixes`).

What a worker serves cannot be read off its parameters alone: vLLM fuses them (q/k/v into `qkv_proj`) and its
CPU build repacks every linear layer into a oneDNN handle, leaving the parameter empty. So each load is checked
twice: the bytes that arrived are hashed and compared with the version's digest (`DrafterVersion.digest`) and
their names with the whole drafter's before anything is loaded, and a fingerprint of every
tensor the module still exposes (embeddings, norms, heads, buffers; all of them on a GPU) is taken right after. A
worker reports the version digest it loaded only while that fingerprint still holds; a drafter dropped at wake,
zeroed, or half-loaded reports None, and the engine loads the published version again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from specroll.rollout.drafters.version import drafter_digest

from . import cpu_fixes

cpu_fixes.apply()

ROLES = ("target", "drafter")


class SpecrollWorkerExtension:
    """Mixed into vLLM's worker class (see the module doc); every method is a `collective_rpc` target."""

    def specroll_load(self, role: str, named: Mapping[str, torch.Tensor], digest: str | None = None,
                      wire_dtype: str | None = None, expected_names: list[str] | None = None) -> dict:
        """Load `named` (checkpoint names, e.g. Hugging Face's) into the role's model in place. With `digest`, the
        received tensors must hash to it first (`drafter_digest` in `wire_dtype`); with `expected_names` (the
        model's checkpoint names), all of them must be there (a partial drafter is refused before anything is
        written; a tied head's alias may come on top). Returns what was loaded."""
        module = self._specroll_module(role)
        missing = sorted(set(expected_names or ()) - set(named))
        if missing:
            raise ValueError(f"{role} weights are not the whole model: {len(missing)} of {len(expected_names)} "
                             f"tensors missing (e.g. {missing[:3]}); nothing was loaded")
        if digest is not None:
            dtype = None if wire_dtype is None else getattr(torch, wire_dtype)
            received = drafter_digest(named, None, dtype)
            if received != digest:
                raise ValueError(f"{role} weights arrived with digest {received}, not the version's {digest}: "
                                 "the transfer changed them")
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        shared = self._specroll_shared() if role == "drafter" else set()
        own = {name: tensor for name, tensor in named.items() if ".".join(name.split(".")[-2:]) not in shared}
        reload_weights(self.vllm_config, module, iter(own.items()), None, True)
        self._specroll_records()[role] = (digest, self._specroll_fingerprint(module, shared))
        return {"role": role, "tensors": len(named), "fingerprint": self._specroll_records()[role][1]}

    def specroll_served(self, role: str) -> str | None:
        """The digest of the version last loaded into `role`, or None when the module no longer holds what that
        load wrote (its fingerprint moved) or nothing was loaded through `specroll_load`."""
        record = self._specroll_records().get(role)
        if record is None:
            return None
        digest, fingerprint = record
        shared = self._specroll_shared() if role == "drafter" else set()
        return digest if self._specroll_fingerprint(self._specroll_module(role), shared) == fingerprint else None

    def specroll_cpu_fix(self) -> dict:
        """Whether this worker's vLLM still has the CPU expand defect, and whether specroll's repair is in."""
        return {"defective": cpu_fixes.defective(), "repaired": cpu_fixes.apply()}

    def _specroll_module(self, role: str) -> torch.nn.Module:
        if role == "target":
            return self.model_runner.model
        if role == "drafter":
            drafter = getattr(self.model_runner, "drafter", None)
            model = getattr(drafter, "model", None)
            if model is None:
                raise ValueError("this vLLM engine has no drafter model to load (speculative method "
                                 f"{getattr(self.vllm_config.speculative_config, 'method', None)!r})")
            return model
        raise ValueError(f"role={role!r} is invalid: one of {ROLES}")

    def _specroll_shared(self) -> set[str]:
        """The drafter's tensors that are the target's own (vLLM shares EAGLE's embedding and LM head with the target
        when they are equal), as `module.param` keys: the policy sync writes them, so a drafter load skips them and
        the drafter's fingerprint leaves them out."""
        target = {id(p) for p in self.model_runner.model.parameters()}
        return {".".join(name.split(".")[-2:]) for name, p in self._specroll_module("drafter").named_parameters()
                if id(p) in target}

    def _specroll_records(self) -> dict:
        if not hasattr(self, "_specroll_loaded"):
            self._specroll_loaded = {}
        return self._specroll_loaded

    @staticmethod
    def _specroll_fingerprint(module: torch.nn.Module, shared: set[str]) -> str:
        """BLAKE2b over every non-empty parameter and buffer of `module` but the `shared` ones (KV caches are
        attributes, not buffers)."""
        digest = hashlib.blake2b(digest_size=16)
        tensors = [*module.named_parameters(), *module.named_buffers()]
        for name, tensor in sorted(tensors, key=lambda item: item[0]):
            if tensor.numel() == 0 or ".".join(name.split(".")[-2:]) in shared:
                continue
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

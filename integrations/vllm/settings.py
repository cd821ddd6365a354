"""VllmSettings: what only the vLLM engine needs, beside the `EngineConfig` fields both engines read.

    engine:            # EngineConfig, shared: max_batch_size → max_num_seqs, max_seq_len → max_model_len,
      kind: vllm       #   gamma → num_speculative_tokens, dtype, drafters → vLLM's proposer
    vllm:              # VllmSettings
      kv_cache_gib: 2

On a CPU the vLLM engine busy-waits its OpenMP threads: two engines, or an engine beside a trainer on the same
cores, collapse (0.5 tok/s at load 16 was measured). `omp_threads_bind` pins its threads ("auto": vLLM's choice,
one per core; "nobind": the OS schedules them, for a machine shared with other work; or a core list such as
"0-1"), `kv_cache_gib` sets its KV cache size (`VLLM_CPU_KVCACHE_SPACE`). Both are environment variables vLLM reads
when an engine starts, so they are set then (an explicit value in the environment wins).
"""

from __future__ import annotations

from dataclasses import dataclass

from specroll.rollout.config import require

SLEEP_LEVELS = (0, 1, 2)


@dataclass
class VllmSettings:
    """`kv_cache_gib`: KV cache on a CPU (whole GiB); `gpu_memory_utilization`: the share of a GPU vLLM may take;
    `omp_threads_bind`: see the module doc; `enforce_eager`: no CUDA graphs / torch.compile (start-up in seconds,
    slower steps; always on a CPU); `sleep_level`: what `release` frees on a GPU (1: KV cache, weights to host
    memory; 2: both dropped, reloaded by specroll at `allocate`; 0: `release` frees nothing)."""

    kv_cache_gib: int = 2
    gpu_memory_utilization: float = 0.5
    omp_threads_bind: str = "nobind"
    enforce_eager: bool = True
    sleep_level: int = 1

    def __post_init__(self) -> None:
        whole = isinstance(self.kv_cache_gib, int) and not isinstance(self.kv_cache_gib, bool)
        require(whole and self.kv_cache_gib >= 1, "vllm.kv_cache_gib", self.kv_cache_gib,
                "an int number of GiB >= 1 (vLLM reads whole GiB)")
        require(isinstance(self.gpu_memory_utilization, (int, float)) and 0 < self.gpu_memory_utilization <= 1,
                "vllm.gpu_memory_utilization", self.gpu_memory_utilization, "a number in (0, 1]")
        require(isinstance(self.omp_threads_bind, str) and bool(self.omp_threads_bind), "vllm.omp_threads_bind",
                self.omp_threads_bind, '"auto", "nobind" or a core list such as "0-1"')
        require(isinstance(self.enforce_eager, bool), "vllm.enforce_eager", self.enforce_eager, "true or false")
        require(self.sleep_level in SLEEP_LEVELS, "vllm.sleep_level", self.sleep_level, f"one of {SLEEP_LEVELS}")

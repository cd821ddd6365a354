"""specroll.bench — `specroll bench`: specroll against HF generate and assisted generation, ratios from one run.

`engine_bench` is the command (`specroll.cli`); the races it runs and what they need sit beside it: the
contenders and their lockstep races (`contenders`, `engine_race`), the models and prompts (`models`), the
GRPO-shaped workload (`grpo_bench`), the long-tail workload (`long_tail`, `long_tail_contenders`,
`long_tail_report`), the real-shape cost table (`real_shape`, `real_shape_costs`, `real_shape_check`,
`fixed_acceptance`, `shapes`) and the JSON file every part writes (`results`); `vllm_compare` puts specroll beside
vLLM plain decoding in one interleaved run. `gpu_check` runs these
workloads on a GPU in one script (`gpu_check_install.sh` makes it importable on a machine without network;
`sync_count` counts its host↔device syncs).

One-off measurements that are not part of the command live outside the package, in the checkout's `studies/`.
"""

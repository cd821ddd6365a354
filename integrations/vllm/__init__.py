"""specroll on vLLM: rollouts in the engine RL runs on, with specroll's learner, gate, probe and drafter checks.

`engine.VllmEngine` (one in-process `vllm.LLM`, `engine.kind: vllm`), `backend.VllmBackend` (the in-process backend
over it), `worker_extension` (weights in place and the served-drafter digest, over `collective_rpc`), `proposers`
(drafter kind → vLLM proposer), `signals` (the learner's signals from a forward of the policy), `cpu_fixes` (vLLM's
CPU build verifies T > 0 drafts against garbage temperatures: repaired here), `kernel_scan` (a second engine in a
process that imported numba fails to start: repaired here), `gamma` (`gamma: auto`: drafts per live batch size from
vLLM's timed step costs), `refusals` (what vLLM cannot serve, refused before it starts), `settings` (`VllmSettings`).
Importing this package does not import vLLM; the modules that need it import it when used.
"""

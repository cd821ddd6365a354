"""Weight sync to the rollout workers: named tensors in versioned, all-or-nothing steps.

- `protocol`: the sync itself — pack tensors into byte buckets, stage them on every live worker, post the
  version on the board (the commit point), commit everywhere — and the default object-store transport;
- `sequence`: those steps in order for one role's version (`sync_weights`), a drafter's checked against the
  learner's digest by every receiver;
- `transports`: the transport a config names (`make_transport`);
- `broadcast`: the `torch.distributed` transport (gloo on CPU, NCCL on GPU), one persistent group per
  controller, buckets built and received on the group's device;
- `payload`: what a sync sends besides the bytes (layout, version, route, digest), standard library only;
- `board`: the `WeightBoard` actor, the latest committed payload per role, which a restarted worker loads
  (from the object store, or after a broadcast from a peer that holds it).

The trainer's side (gathering ZeRO-3 / PEFT weights) is `integrations.trl_hook.policy_sync`; the engine's
(in-place loading, checked first) is `rollout.models.weights`. Nothing here imports torch at package level:
the board's process stays light.
"""

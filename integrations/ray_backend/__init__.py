"""The Ray `RolloutBackend`: a controller (`controller`) over rollout-worker actors (`worker`) and a draft
learner actor (`learner_actor`), started together (`actors`); the learner's rounds, and its restart from its last
state, driven by `learner_driver`; every worker's served drafter checked after each drafter event
(`drafter_guard`); fault-tolerant dispatch of prompt chunks (`dispatch`); versioned weight sync (`sync/`: the
protocol, its two transports, one sync in order, the payload and the board), Prometheus metrics (`metrics`), the
loopback-only cluster (`cluster`) and its settings (`settings`, importable without Ray); one service for all ranks
of a multi-process trainer (`shared_service`, its actors' names in `service_names`)."""

"""The Ray `RolloutBackend`: a controller (`controller`) over rollout-worker actors (`worker`), a draft
learner actor (`learner_actor`), versioned weight sync (`sync/`: the protocol, its two
transports, the payload and the board), Prometheus metrics (`metrics`), the loopback-only cluster (`cluster`) and its
settings (`settings`, importable without Ray); one service for all ranks of a multi-process trainer
(`shared_service`, its actors' names in `service_names`)."""

"""What the learner reports: one training round (`LearnerReport`) and one probe (`ProbeReport`), built with
keywords only (`kw_only`): each has more than a dozen fields, several of one type, that no reader should count."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class LearnerReport:
    """One round. Acceptances are expected acceptance Σ min(p, q) on the held-out positions (every
    version's held-out groups): the published drafter before the round, the candidate after it, the
    frozen shadow; `gain` ± `gain_se` is candidate − published, paired. A round that only trained
    (`gated` False: the candidate had not trained as long as scoring it costs) has nan there."""

    published: bool
    version: int  # drafter version after the round (moved if published or reverted)
    acceptance_before: float
    acceptance_after: float
    acceptance_frozen_shadow: float
    gain: float
    gain_se: float
    loss: float  # mean training loss over the round's steps (nan without steps)
    train_time_s: float  # optimizer steps
    eval_time_s: float  # held-out scoring
    round_time_s: float  # the whole round
    budget_s: float | None  # the time the round was given (None: steps only)
    num_positions: int  # completion positions trained on (with repetition)
    num_steps: int
    num_holdout_positions: int
    num_holdout_groups: int
    policy_version: int  # the newest policy version the learner has seen
    event: str | None = None  # the watchdog's, or a candidate reset: what happened and why
    gated: bool = True  # the candidate was scored and judged this round
    alarms: tuple[str, ...] = ()  # alarms this round raised: the learner stopped learning (`alarms.LearnerAlarms`)
    alarms_active: int = 0  # alarm conditions that hold after this round (raised now or before)


@dataclass(kw_only=True)
class ProbeReport:
    """Served and frozen drafters on a probe batch (fresh rollouts of fixed prompts, never trained on)."""

    served: float
    frozen: float
    gain: float  # served − frozen, paired by prompt group
    gain_se: float
    served_se: float  # each curve's own standard error (unpaired), for bands
    frozen_se: float
    num_positions: int
    num_groups: int
    policy_version: int
    drafter_version: int  # the version scored (before any revert this probe caused)
    event: str | None = None
    time_s: float = 0.0  # the learner's scoring of the probe (its rollouts are the workers' time)
    # The served drafter's expected-acceptance sum and position count per prompt group, in the probe's group
    # order: with the invariant sampler two runs probe the same positions, so two drafters from two runs
    # compare paired (`tools.probe_compare`).
    served_group_sums: list[float] | None = None
    group_counts: list[float] | None = None

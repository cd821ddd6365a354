"""The gate: what decides whether a trained drafter is served, and when the served one must be replaced.

`holdout.py` (`HoldoutSet`: the prompt groups held out of training, the positions every decision is taken on),
`held_out_scores.py` (the published and frozen drafters' cached scores on them), `paired.py` (the paired gain of
two drafters on the same positions, clustered by prompt group), `candidate.py` (the trained copy and the average of
it that is judged and published), `watchdog.py` (when the served drafter falls below the frozen one or break-even)
and `alarms.py` (`LearnerAlarms`: the learner says so when it stops learning). `learner.Learner` runs them.
"""

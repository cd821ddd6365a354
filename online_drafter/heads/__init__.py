"""The feature-head family: an EAGLE-style head or Medusa heads trained on the policy's own hidden states.

`data.py` (what the learner keeps of a rollout, its batch and buffer), `scorer.py` (loss and expected
acceptance over the draft depths), `objectives.py` (where each head predicts what, teacher-forced),
`learner.py` (`HeadLearner`: the shared `learner.Learner` on this data).
"""

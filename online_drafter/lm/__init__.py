"""The drafter LM family: an independent small LM distilled toward the policy on buffered rollouts.

`data.py` (what the learner keeps of a rollout, its batch and buffer), `scorer.py` (log q, loss, expected
acceptance), `learner.py` (`DraftLearner`: the shared `learner.Learner` on this data, with checkpoints).
"""

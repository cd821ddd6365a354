"""specroll.tools — the documented tools that work on your runs and your environment, `python -m specroll.tools.X`:

- `interleave`: two `specroll train` configs taking turns on the machine, step by step (a paired speed claim);
- `probe_compare` and `cold_start_compare`: two runs' served drafters compared paired on the same probe positions;
- `learner_replay`: a recorded learner (`learner.record_dir`) rerun under other settings;
- `resume_check`: a run killed and resumed against the same run uninterrupted;
- `arch_sweep`: which transformers model types the engine runs exactly (`rollout.models.architectures`).

`specroll bench` is `specroll.bench`; one-off measurements live outside the package, in the checkout's `studies/`.
"""

"""Foreign drafter formats: public checkpoint folders of other projects, read into our heads (refused where they do
not fit the target).

`eagle3.py` (EAGLE-3: the vllm-project/speculators layout and SpecForge's, as `Eagle3Head`s) and `dflash.py`
(z-lab's DFlash block drafters, as `BlockHead`s). `model_source.load_drafter` reads them for `models.head`. Not resume
files: a run's own checkpoints are `specroll.jobs.checkpoints` and `online_drafter.state`.
"""

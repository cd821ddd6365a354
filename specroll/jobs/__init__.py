"""The jobs: `specroll train` (`train`, its config `train_config`, its `report`) and the Ray rollout
job (`ray_job`). They compose the library (`specroll.integrations`) with a task — the embedded demo
by default."""

"""The learner's resumable state: what a resumed run needs, and the file it is kept in.

`learner_state.py` (`state_of` / `restore`: weights, optimizer, buffer, held-out set, counters, alarms) and
`checkpoint.py` (`save_checkpoint` / `load_checkpoint`: written atomically, read back checked). Resume files, not
drafter formats: a foreign drafter's checkpoint folder is read by `integrations.formats`.
"""

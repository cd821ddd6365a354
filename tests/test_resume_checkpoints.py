"""specroll's state beside a trainer checkpoint (`jobs.checkpoints`, `jobs.resume`): written all or nothing,
the newest whole one found, another config's refused in one line, and the checkpoint section validated."""

from __future__ import annotations

import dataclasses

import pytest

from specroll.integrations.yaml_config import ConfigError, from_dict
from specroll.jobs import checkpoints
from specroll.jobs.checkpoints import find_checkpoint, read_saved_run, write_saved_run
from specroll.jobs.resume import check_matches, fingerprint
from specroll.jobs.train_config import TrainConfig

BACKEND_STATE = {"learner": None, "total_rollouts": 12}


def saved_run(root, step: int, config: TrainConfig | None = None) -> None:
    folder = root / "trainer" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    write_saved_run(folder, {"step": step, "fingerprint": fingerprint(config or TrainConfig())}, BACKEND_STATE)


def test_the_newest_whole_checkpoint_is_found_and_an_incomplete_one_skipped(tmp_path, capsys):
    for step in (2, 10):
        saved_run(tmp_path, step)
    (tmp_path / "trainer" / "checkpoint-12").mkdir()  # TRL's files, killed before specroll's state
    saved = find_checkpoint(tmp_path)
    assert saved.step == 10 and saved.path == tmp_path / "trainer" / "checkpoint-10" and saved.run_dir == tmp_path
    assert f"skipping {tmp_path / 'trainer' / 'checkpoint-12'}: incomplete" in capsys.readouterr().out
    assert saved.backend_state() == BACKEND_STATE
    assert find_checkpoint(tmp_path / "trainer" / "checkpoint-2").step == 2


def test_a_crash_mid_write_leaves_the_checkpoint_without_specroll_state(tmp_path, monkeypatch):
    folder = tmp_path / "trainer" / "checkpoint-3"
    folder.mkdir(parents=True)

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(checkpoints, "save_checkpoint", killed)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_saved_run(folder, {"step": 3, "fingerprint": {}}, BACKEND_STATE)
    assert list(folder.iterdir()) == []  # neither specroll/ nor its temporary folder
    with pytest.raises(ConfigError, match=r"no whole checkpoint to resume from \(1 incomplete"):
        find_checkpoint(tmp_path)


def test_a_checkpoint_written_again_replaces_the_old_state(tmp_path):
    saved_run(tmp_path, 4)
    folder = tmp_path / "trainer" / "checkpoint-4"
    write_saved_run(folder, {"step": 4, "fingerprint": {}, "hook": 7}, {**BACKEND_STATE, "total_rollouts": 99})
    assert read_saved_run(folder).run["hook"] == 7 and read_saved_run(folder).backend_state()["total_rollouts"] == 99
    assert sorted(p.name for p in folder.iterdir()) == ["specroll"]


@pytest.mark.parametrize("where", ["missing", "no_checkpoints", "other_format"])
def test_nothing_to_resume_is_one_config_error_naming_the_folder(tmp_path, where):
    if where == "other_format":
        saved_run(tmp_path, 1)
        (tmp_path / "trainer" / "checkpoint-1" / "specroll" / "run.json").write_text('{"format": 99, "step": 1}')
    path = tmp_path / "nowhere" if where == "missing" else tmp_path
    with pytest.raises(ConfigError, match=rf"^--resume {path}"):
        find_checkpoint(path)


def test_a_checkpoint_of_another_drafter_kind_is_refused_naming_the_field(tmp_path):
    config = TrainConfig()
    saved_run(tmp_path, 5, config)
    saved = find_checkpoint(tmp_path)
    check_matches(saved, dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, steps=99)))  # may change
    other = dataclasses.replace(config, engine=dataclasses.replace(config.engine, drafters=("suffix",)))
    with pytest.raises(ConfigError, match=r"engine\.drafters: checkpoint None, config \['suffix'\]") as err:
        check_matches(saved, other)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("section", "message"), [
    ({"checkpoint": {"keep": 1}}, r"checkpoint\.keep=1 is invalid: null \(keep all\) or an int >= 2"),
    ({"checkpoint": {"every": -1}}, r"checkpoint\.every=-1 is invalid"),
    ({"grpo": {"extra": {"save_steps": 5}}}, r"grpo\.extra=\['save_steps'\] is invalid: no checkpoint fields"),
    ({"grpo": {"num_iterations": 2}, "checkpoint": {"every": 3}}, r"checkpoint\.every=3 is invalid: a multiple"),
    ({"learner": {"record_dir": "rec"}, "checkpoint": {"every": 1}}, r"learner\.record_dir='rec' is invalid"),
])
def test_the_checkpoint_section_is_validated(section, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(TrainConfig, section)


def test_checkpoints_every_generation_are_allowed():
    config = from_dict(TrainConfig, {"grpo": {"num_iterations": 2}, "checkpoint": {"every": 4, "keep": 2}})
    assert config.checkpoint.every == 4 and config.checkpoint.keep == 2


def test_a_checkpoint_of_other_eagle3_layers_is_refused_and_one_from_before_the_field_is_not(tmp_path):
    eagle3 = dataclasses.replace(TrainConfig().engine, drafters=("eagle3",), eagle3_layers=(1, 2, 3))
    config = dataclasses.replace(TrainConfig(), engine=eagle3)
    saved_run(tmp_path, 5, config)
    other = dataclasses.replace(config, engine=dataclasses.replace(eagle3, eagle3_layers=(0, 2, 3)))
    with pytest.raises(ConfigError, match=r"engine\.eagle3_layers: checkpoint \[1, 2, 3\], config \[0, 2, 3\]"):
        check_matches(find_checkpoint(tmp_path), other)
    older = tmp_path / "older"  # written by a specroll that did not record the EAGLE-3 and block fields
    folder = older / "trainer" / "checkpoint-5"
    folder.mkdir(parents=True)
    recorded = {k: v for k, v in fingerprint(TrainConfig()).items() if "eagle3" not in k and "block" not in k}
    write_saved_run(folder, {"step": 5, "fingerprint": recorded}, BACKEND_STATE)
    check_matches(find_checkpoint(older), TrainConfig())

"""Strict config merging, _BASE_ inheritance, error messages and dump round trip."""

import logging

import pytest

from trainkit.config import CfgNode, ConfigError, get_cfg

API_KEYS = """MODEL.DEVICE MODEL.META_ARCHITECTURE MODEL.WEIGHTS DATASETS.TRAIN DATASETS.TEST
DATALOADER.NUM_WORKERS DATALOADER.ASPECT_RATIO_GROUPING DATALOADER.SAMPLER_TRAIN
DATALOADER.REPEAT_THRESHOLD SOLVER.IMS_PER_BATCH SOLVER.BASE_LR SOLVER.MOMENTUM
SOLVER.WEIGHT_DECAY SOLVER.WEIGHT_DECAY_NORM SOLVER.MAX_ITER SOLVER.STEPS SOLVER.GAMMA
SOLVER.LR_SCHEDULER_NAME SOLVER.WARMUP_ITERS SOLVER.WARMUP_FACTOR SOLVER.WARMUP_METHOD
SOLVER.CHECKPOINT_PERIOD SOLVER.REFERENCE_WORLD_SIZE SOLVER.CLIP_GRADIENTS.ENABLED
SOLVER.CLIP_GRADIENTS.CLIP_TYPE SOLVER.CLIP_GRADIENTS.CLIP_VALUE SOLVER.CLIP_GRADIENTS.NORM_TYPE
SOLVER.AMP.ENABLED TEST.EVAL_PERIOD OUTPUT_DIR SEED CUDNN_BENCHMARK VERSION""".split()


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def test_defaults_have_api_keys_and_are_fresh_copies():
    cfg = get_cfg()
    for key in API_KEYS:
        _get(cfg, key)
    cfg.SOLVER.BASE_LR = 123.0
    assert get_cfg().SOLVER.BASE_LR != 123.0


def test_base_inheritance_relative_and_recursive(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("SOLVER:\n  BASE_LR: 0.5\n  MAX_ITER: 10\n")
    (tmp_path / "sub" / "mid.yaml").write_text("_BASE_: ../root.yaml\nSOLVER:\n  MAX_ITER: 20\n")
    (tmp_path / "sub" / "leaf.yaml").write_text("_BASE_: mid.yaml\nSOLVER:\n  STEPS: [5, 8]\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(tmp_path / "sub" / "leaf.yaml"))
    assert cfg.SOLVER.BASE_LR == 0.5
    assert cfg.SOLVER.MAX_ITER == 20
    assert cfg.SOLVER.STEPS == (5, 8)  # list coerced to the default's tuple


def test_base_cycle_is_reported(tmp_path):
    (tmp_path / "a.yaml").write_text("_BASE_: b.yaml\n")
    (tmp_path / "b.yaml").write_text("_BASE_: a.yaml\n")
    with pytest.raises(ConfigError, match=r"_BASE_ cycle.*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        get_cfg().merge_from_file(str(tmp_path / "a.yaml"))


def test_unknown_key_in_file_names_key_file_and_suggestion(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("SOLVER:\n  BASE_LRR: 0.1\n")
    with pytest.raises(ConfigError) as info:
        get_cfg().merge_from_file(str(path))
    msg = str(info.value)
    assert "SOLVER.BASE_LRR" in msg and str(path) in msg and "Did you mean SOLVER.BASE_LR?" in msg


def test_unknown_key_on_command_line():
    message = r"unknown config key MAX_ITER in the command line\. Did you mean SOLVER.MAX_ITER\?"
    with pytest.raises(ConfigError, match=message):
        get_cfg().merge_from_list(["MAX_ITER", "5"])


def test_a_flag_after_the_overrides_says_to_put_flags_first():
    # `train_net.py ... SOLVER.MAX_ITER 5 --resume`: argparse hands "--resume" to the config.
    with pytest.raises(ConfigError, match=r"--resume came after the config overrides"):
        get_cfg().merge_from_list(["SOLVER.MAX_ITER", "5", "--resume"])
    with pytest.raises(ConfigError, match=r"--dry-run-json came after the config overrides"):
        get_cfg().merge_from_list(["SOLVER.MAX_ITER", "5", "--dry-run-json", "x.json"])
    # a value that starts with "-" is a value
    assert get_cfg().merge_from_list(["SOLVER.BASE_LR", "-1"]) is None


def test_wrong_type_names_key_expected_and_given(tmp_path):
    with pytest.raises(ConfigError, match=r"SOLVER.MAX_ITER .*expects int .*got str 'many'"):
        get_cfg().merge_from_list(["SOLVER.MAX_ITER", "many"])
    path = tmp_path / "t.yaml"
    path.write_text("SOLVER:\n  BASE_LR: [1, 2]\n")
    message = r"SOLVER.BASE_LR \(in file .*t\.yaml\) expects float.*got list"
    with pytest.raises(ConfigError, match=message):
        get_cfg().merge_from_file(str(path))


def test_int_accepted_for_float_and_literals_parsed():
    cfg = get_cfg()
    cfg.merge_from_list(
        ["SOLVER.BASE_LR", "1", "SOLVER.STEPS", "(10, 20)", "MODEL.WEIGHTS", "w.pth"]
    )
    assert cfg.SOLVER.BASE_LR == 1.0 and isinstance(cfg.SOLVER.BASE_LR, float)
    assert cfg.SOLVER.STEPS == (10, 20)
    assert cfg.MODEL.WEIGHTS == "w.pth"


def test_odd_override_list():
    with pytest.raises(ConfigError, match="KEY VALUE pairs"):
        get_cfg().merge_from_list(["SOLVER.BASE_LR"])


def test_missing_file_and_yaml_error_with_line(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        get_cfg().merge_from_file(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "syntax.yaml"
    bad.write_text("SOLVER:\n  BASE_LR: 0.1\n  MAX_ITER: [1, 2\n")
    with pytest.raises(ConfigError, match=r"YAML syntax error in .*syntax\.yaml at line \d+"):
        get_cfg().merge_from_file(str(bad))


def test_key_that_yaml_reads_as_a_number_or_bool_is_a_config_error(tmp_path):
    for text, key in (("MODEL:\n  1: 2\n", "MODEL.1"), ("yes: 3\n", "True")):
        path = tmp_path / "keys.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"config key {key} \(in file .*keys\.yaml\)"):
            get_cfg().merge_from_file(str(path))


def test_yaml_cannot_run_code(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("SEED: 1\nOUTPUT_DIR: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError) as info:
        get_cfg().merge_from_file(str(evil))
    message = str(info.value)
    assert "syntax error" not in message
    assert "evil.yaml:2" in message and "!!python/object/apply:os.system" in message
    assert "refused by design" in message and "allow_unsafe=True" in message


def test_python_tag_in_a_base_file_names_that_file_and_line(tmp_path):
    (tmp_path / "base.yaml").write_text("SOLVER:\n  STEPS: !!python/tuple [10, 20]\n")
    (tmp_path / "leaf.yaml").write_text("_BASE_: base.yaml\nSEED: 3\n")
    with pytest.raises(ConfigError, match=r"base\.yaml:2 \(the _BASE_ of .*leaf\.yaml\): the YAML"):
        get_cfg().merge_from_file(str(tmp_path / "leaf.yaml"))


def test_allow_unsafe_loads_python_tags_with_a_warning(tmp_path, caplog):
    (tmp_path / "base.yaml").write_text("SOLVER:\n  STEPS: !!python/tuple [10, 20]\n")
    (tmp_path / "leaf.yaml").write_text("_BASE_: base.yaml\nSEED: 3\n")
    cfg = get_cfg()
    with caplog.at_level(logging.WARNING, logger="trainkit.config.yaml_files"):
        cfg.merge_from_file(str(tmp_path / "leaf.yaml"), allow_unsafe=True)
    assert (cfg.SOLVER.STEPS, cfg.SEED) == ((10, 20), 3)
    assert cfg.get_origin("SOLVER.STEPS").endswith("base.yaml:2")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unsafe loader" in warnings[0] and "base.yaml" in warnings[0]
    # a file the safe loader reads is read with it, without a warning
    (tmp_path / "safe.yaml").write_text("SOLVER:\n  STEPS: [10, 20]\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainkit.config.yaml_files"):
        get_cfg().merge_from_file(str(tmp_path / "safe.yaml"), allow_unsafe=True)
    assert not caplog.records


def test_dump_loads_back_equal(tmp_path):
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.STEPS", "(3, 4)", "DATASETS.TRAIN", "('a', 'b')", "SEED", "7"])
    path = tmp_path / "dumped.yaml"
    path.write_text(cfg.dump())
    again = get_cfg()
    again.merge_from_file(str(path))
    assert again == cfg


def test_new_allowed_group_accepts_user_keys():
    cfg = get_cfg()
    cfg.merge_from_list(["GLOBAL.MY_FLAG", "True"])
    assert cfg.GLOBAL.MY_FLAG is True
    assert isinstance(CfgNode({"A": 1}), CfgNode)

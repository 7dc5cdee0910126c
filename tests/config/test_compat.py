"""detectron2's config versions: old files' renamed keys load; whole configs convert both ways."""

import pytest

from trainkit.config import ConfigError, downgrade_config, get_cfg, upgrade_config
from trainkit.config.compat import LATEST_VERSION


def _merge(cfg, tmp_path, text):
    path = tmp_path / "old.yaml"
    path.write_text(text)
    cfg.merge_from_file(str(path))
    return cfg


def test_the_defaults_are_the_latest_version():
    assert get_cfg().VERSION == LATEST_VERSION == 2


def test_downgrade_then_upgrade_gives_the_config_back():
    cfg = get_cfg()
    cfg.USER_CUSTOM = 1
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[8, 16]]
    old = downgrade_config(cfg, to_version=0)
    assert old.VERSION == 0 and old.MODEL.RPN_HEAD.NAME == cfg.MODEL.RPN.HEAD_NAME
    assert old.MODEL.RPN.ANCHOR_SIZES == [[8, 16]] and "WEIGHTS" not in old.MODEL
    assert upgrade_config(old) == cfg
    with pytest.raises(ValueError, match="cannot upgrade"):
        upgrade_config(cfg, to_version=1)


def test_a_version_0_file_has_its_keys_renamed(tmp_path):
    cfg = _merge(get_cfg(), tmp_path, "MODEL:\n  RPN_HEAD:\n    NAME: TEST\nVERSION: 0\n")
    assert cfg.MODEL.RPN.HEAD_NAME == "TEST" and cfg.VERSION == 2


def test_a_file_without_version_but_with_version_1_keys_is_upgraded(tmp_path):
    cfg = _merge(get_cfg(), tmp_path, "MODEL:\n  WEIGHT: /w.pth\nTEST:\n  AUG_ON: True\n")
    assert cfg.MODEL.WEIGHTS == "/w.pth" and cfg.TEST.AUG.ENABLED is True
    assert cfg.VERSION == 2


def test_a_latest_file_keeps_the_strict_checks(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key MODEL\.WEIGHT in file"):
        _merge(get_cfg(), tmp_path, "VERSION: 2\nMODEL:\n  WEIGHT: /w.pth\n")

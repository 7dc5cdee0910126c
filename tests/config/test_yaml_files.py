"""Reading YAML config files: values and key lines through a _BASE_ chain, refused tags."""

import pytest

from trainkit.config import ConfigError
from trainkit.config.cfg_node import CfgNode
from trainkit.config.yaml_files import load_yaml_with_origins


def test_the_including_file_wins_over_its_base_for_values_and_lines(tmp_path):
    (tmp_path / "base.yaml").write_text("SOLVER:\n  BASE_LR: 0.1\n  MAX_ITER: 10\n")
    (tmp_path / "leaf.yaml").write_text("_BASE_: base.yaml\nSOLVER:\n  BASE_LR: 0.5\n")
    values, origins = load_yaml_with_origins(str(tmp_path / "leaf.yaml"))
    assert values == {"SOLVER": {"BASE_LR": 0.5, "MAX_ITER": 10}}
    assert origins["SOLVER.BASE_LR"].endswith("leaf.yaml:3")
    assert origins["SOLVER.MAX_ITER"].endswith("base.yaml:3")
    # CfgNode's detectron2 entry point returns the same values
    assert CfgNode.load_yaml_with_base(str(tmp_path / "leaf.yaml")) == values


def test_a_python_tag_is_refused_unless_allowed(tmp_path):
    path = tmp_path / "tuple.yaml"
    path.write_text("STEPS: !!python/tuple [1, 2]\n")
    with pytest.raises(ConfigError, match=r"tuple\.yaml:1: the YAML tag !!python/tuple"):
        load_yaml_with_origins(str(path))
    assert load_yaml_with_origins(str(path), allow_unsafe=True)[0] == {"STEPS": (1, 2)}

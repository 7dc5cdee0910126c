"""Config provenance: where each value came from, through files, overrides, code and copies."""

import copy as copy_module
import pickle
import sys
import textwrap

import pytest
import yaml

from trainkit.config import CfgNode, get_cfg
from trainkit.config.provenance import config_changes, format_config_changes, record_changes


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def chain(tmp_path):
    """base.yaml <- child.yaml: BASE_LR set in both, MAX_ITER only in the base."""
    _write(
        tmp_path / "base.yaml",
        """\
        SOLVER:
          BASE_LR: 0.5
          MAX_ITER: 30
        MODEL:
          DEVICE: cpu
        """,
    )
    child = _write(
        tmp_path / "child.yaml",
        """\
        _BASE_: base.yaml
        # a comment line, so lines are counted in the file, not in the data
        SOLVER:
          STEPS: [10, 20]

          BASE_LR: 0.25
        """,
    )
    return child


def test_file_line_through_base_chain_then_command_line(chain, tmp_path):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    assert cfg.get_origin("SOLVER.MAX_ITER") == f"{tmp_path / 'base.yaml'}:3"
    assert cfg.get_origin("MODEL.DEVICE") == f"{tmp_path / 'base.yaml'}:5"  # = the default
    assert cfg.get_origin("SOLVER.BASE_LR") == f"{chain}:6"  # the child overrides the base
    assert cfg.get_origin("SOLVER.STEPS") == f"{chain}:4"
    cfg.merge_from_list(["SOLVER.BASE_LR", "0.125"])
    assert cfg.get_origin("SOLVER.BASE_LR") == "command line"
    assert cfg.get_origin("SOLVER.MAX_ITER").endswith("base.yaml:3")  # untouched


def test_paths_inside_the_working_directory_are_shown_relative(chain, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = get_cfg()
    cfg.merge_from_file("child.yaml")
    assert cfg.get_origin("SOLVER.MAX_ITER") == "base.yaml:3"


def test_defaults_have_no_origin():
    cfg = get_cfg()
    assert cfg.get_origin("SOLVER.BASE_LR") is None
    assert config_changes(cfg, get_cfg()) == []


def _refuse(*args, **kwargs):
    raise AssertionError("called on an assignment")


def test_an_assignment_in_code_records_nothing_and_is_listed_as_code(chain, monkeypatch):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    with monkeypatch.context() as patch:  # an assignment copies nothing and reads no frame
        patch.setattr(copy_module, "deepcopy", _refuse)
        patch.setattr(sys, "_getframe", _refuse)
        cfg.SOLVER.MAX_ITER = 7  # over a file's value
        cfg.SOLVER.GAMMA = 0.5  # over a default
    assert cfg.get_origin("SOLVER.MAX_ITER") is None and cfg.get_origin("SOLVER.GAMMA") is None
    changes = {c.key: c.origin for c in config_changes(cfg, get_cfg())}
    assert changes["SOLVER.MAX_ITER"] == changes["SOLVER.GAMMA"] == "code"
    assert changes["SOLVER.BASE_LR"] == f"{chain}:6"


def test_an_in_place_edit_of_a_merged_list_is_seen_as_code(tmp_path):
    path = _write(tmp_path / "x.yaml", "DATASETS:\n  TRAIN: [a, b]\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    assert cfg.get_origin("DATASETS.TRAIN") == f"{path}:2"
    cfg.DATASETS.TRAIN = ["a", "b"]  # the same value again: still the file's
    assert cfg.get_origin("DATASETS.TRAIN") == f"{path}:2"
    cfg.DATASETS.TRAIN.append("c")
    assert cfg.get_origin("DATASETS.TRAIN") is None


def test_a_change_that_leaves_no_record_is_reported_as_code(chain):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    cfg.SOLVER["BASE_LR"] = 9.0  # item assignment: no origin recorded
    assert cfg.get_origin("SOLVER.BASE_LR") is None  # the file's origin no longer holds
    changes = {c.key: c for c in config_changes(cfg, get_cfg())}
    assert changes["SOLVER.BASE_LR"].value == 9.0
    assert changes["SOLVER.BASE_LR"].origin == "code"


def test_unknown_key_has_no_origin_to_ask_for():
    with pytest.raises(KeyError, match="SOLVER.NOPE"):
        get_cfg().get_origin("SOLVER.NOPE")
    with pytest.raises(KeyError, match="SOLVER"):
        get_cfg().get_origin("SOLVER")  # a group, not a value


def test_origins_survive_clone_freeze_and_pickle(chain):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    cfg.merge_from_list(["SEED", "4"])
    cfg.freeze()
    expected = {c.key: c.origin for c in config_changes(cfg, get_cfg())}
    assert expected["SEED"] == "command line"
    for copy in (cfg.clone(), pickle.loads(pickle.dumps(cfg))):
        assert copy.is_frozen()
        assert {c.key: c.origin for c in config_changes(copy, get_cfg())} == expected


def test_origins_change_neither_dump_nor_equality(chain):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    cfg.SEED = 1
    # the same values, set by item assignment, which records no origin
    bare = get_cfg()
    for change in config_changes(cfg, get_cfg()):
        *parents, leaf = change.key.split(".")
        node = bare
        for part in parents:
            node = node[part]
        node[leaf] = change.value
    assert bare.get_origin("SEED") is None
    assert bare == cfg and cfg == bare
    assert bare.dump() == cfg.dump()
    assert "origin" not in cfg.dump() and "base.yaml" not in cfg.dump()


def test_merge_from_other_cfg_carries_the_other_configs_origins(chain):
    other = get_cfg()
    other.merge_from_file(str(chain))
    cfg = get_cfg()
    cfg.merge_from_other_cfg(other)
    assert cfg.get_origin("SOLVER.BASE_LR") == f"{chain}:6"
    assert cfg.get_origin("SOLVER.GAMMA") is None  # unchanged default


def test_new_keys_under_a_node_that_allows_them(tmp_path):
    cfg = get_cfg()
    cfg.EXTRA = CfgNode(new_allowed=True)
    path = _write(tmp_path / "x.yaml", "EXTRA:\n  GROUP:\n    A: 1\n  B: two\n")
    cfg.merge_from_file(str(path))
    assert cfg.get_origin("EXTRA.GROUP.A") == f"{path}:3"
    assert cfg.get_origin("EXTRA.B") == f"{path}:4"


def test_record_changes_names_the_step_and_what_it_replaced(chain):
    before = get_cfg()
    before.merge_from_file(str(chain))
    after = before.clone()
    after.SOLVER.BASE_LR = 0.5
    after.SOLVER.GAMMA = 0.5
    record_changes(before, after, "auto-scaling from 1 to 2 processes")
    assert after.get_origin("SOLVER.BASE_LR") == (
        f"auto-scaling from 1 to 2 processes (was 0.25, from {chain}:6)"
    )
    assert after.get_origin("SOLVER.GAMMA") == (
        "auto-scaling from 1 to 2 processes (was 0.1, the default)"
    )
    assert after.get_origin("SOLVER.MAX_ITER") == before.get_origin("SOLVER.MAX_ITER")


def test_report_is_yaml_with_origins_as_comments(chain):
    cfg = get_cfg()
    cfg.merge_from_file(str(chain))
    cfg.merge_from_list(["DATASETS.TRAIN", "('a', 'b')"])
    text = format_config_changes(config_changes(cfg, get_cfg()), header="Changed keys")
    assert text.startswith("# Changed keys\n")
    lines = {line.split(":")[0]: line for line in text.splitlines() if not line.startswith("#")}
    assert lines["DATASETS.TRAIN"].split("#")[1].strip() == "command line"
    assert lines["SOLVER.BASE_LR"].rstrip().endswith("child.yaml:6")
    # MODEL.DEVICE is set in base.yaml, to the default: not a difference
    assert yaml.safe_load(text) == {
        "DATASETS.TRAIN": ["a", "b"],
        "SOLVER.BASE_LR": 0.25,
        "SOLVER.MAX_ITER": 30,
        "SOLVER.STEPS": [10, 20],
    }


def test_a_subclass_that_loads_files_its_own_way_is_still_used(chain):
    class Custom(CfgNode):
        @classmethod
        def load_yaml_with_base(cls, filename, allow_unsafe=False):
            loaded = super().load_yaml_with_base(filename, allow_unsafe)
            loaded["SOLVER"]["MAX_ITER"] = 99
            return loaded

    cfg = Custom(get_cfg())
    cfg.merge_from_file(str(chain))
    assert cfg.SOLVER.MAX_ITER == 99
    assert cfg.get_origin("SOLVER.MAX_ITER") == str(chain)  # the file, without a line

"""LazyConfig, LazyCall and instantiate: load, save and reload, overrides, origins."""

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import DictConfig, ListConfig

from trainkit.config import ConfigError, LazyCall, LazyConfig, instantiate
from trainkit.config.instantiate import dump_dataclass
from trainkit.config.lazy_overrides import flat_config_items
from trainkit.config.provenance import listed_changes, origins_of
from trainkit.utils.errors import MissingFileError

L = LazyCall


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


class Point:
    # A plain class: omegaconf would turn a dataclass instance inside a ListConfig into a
    # config of its own (detectron2's instantiate returns a ListConfig for a ListConfig).
    def __init__(self, x, y=0):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return f"Point({self.x}, {self.y})"


@dataclasses.dataclass
class DPoint:
    x: int
    y: int = 0


@dataclasses.dataclass
class DSegment:
    start: DPoint
    end: DPoint
    tags: tuple = ()


def make_pair(first, second=None):
    return (first, second)


# ---- LazyCall and instantiate ------------------------------------------------------------
def test_lazycall_is_an_editable_description_until_instantiated():
    cfg = L(torch.nn.Conv2d)(in_channels=3, out_channels=8, kernel_size=3)
    assert isinstance(cfg, DictConfig) and cfg._target_ is torch.nn.Conv2d
    cfg.out_channels = 16
    layer = instantiate(cfg)
    assert isinstance(layer, torch.nn.Conv2d)
    assert (layer.in_channels, layer.out_channels, layer.kernel_size) == (3, 16, (3, 3))


def test_instantiate_builds_nested_calls_depth_first_and_lists_item_by_item():
    cfg = L(make_pair)(
        first=L(Point)(x=1, y=2),
        second=[L(Point)(x=3), {"plain": L(Point)(x=4)}, 7],
    )
    first, second = instantiate(cfg)
    assert first == Point(1, 2)
    assert second[0] == Point(3)
    # A mapping without _target_ is returned as it is (detectron2's rule).
    assert second[1]["plain"]._target_ is Point and second[2] == 7
    assert isinstance(instantiate(ListConfig([L(Point)(x=9)])), ListConfig)
    assert instantiate([L(Point)(x=9)]) == [Point(9)]


def test_lazycall_of_a_dataclass_keeps_its_import_path():
    # omegaconf would make a dataclass type a config of its fields.
    cfg = L(DPoint)(x=1)
    assert cfg._target_ == "tests.config.test_lazy.DPoint"
    assert instantiate(cfg) == DPoint(1)


def test_a_dataclass_instance_argument_keeps_its_type_also_after_save(tmp_path):
    cfg = L(make_pair)(first=DPoint(1, 2))
    assert instantiate(cfg) == (DPoint(1, 2), None)
    LazyConfig.save(cfg, str(tmp_path / "c.yaml"))
    assert instantiate(LazyConfig.load(str(tmp_path / "c.yaml"))) == (DPoint(1, 2), None)
    cfg.second = DPoint(3)  # assigned later: omegaconf keeps its type
    assert instantiate(cfg) == (DPoint(1, 2), DPoint(3))


def test_instantiate_accepts_dotted_targets_and_passes_other_values_through():
    assert instantiate({"_target_": "tests.config.test_lazy.Point", "x": 5}) == Point(5)
    assert instantiate(3) == 3 and instantiate("text") == "text"


def test_lazycall_takes_keyword_arguments_only_and_a_callable():
    with pytest.raises(TypeError, match="keyword arguments only"):
        L(Point)(1)
    with pytest.raises(TypeError, match="callable"):
        LazyCall(42)


def test_instantiate_errors_name_the_target_and_the_fix():
    with pytest.raises(ConfigError, match=r"_target_ 'no_such\.module\.Thing' cannot be imported"):
        instantiate({"_target_": "no_such.module.Thing"})
    with pytest.raises(ConfigError, match=r"Point has no argument 'yy' .*Did you mean y\?"):
        instantiate(L(Point)(x=1, yy=2))
    with pytest.raises(ConfigError, match=r"cannot call .*Point .*missing a required argument"):
        instantiate(L(Point)(y=2))
    with pytest.raises(ConfigError, match=r"_target_ .* is a int, not a callable"):
        instantiate({"_target_": 3})
    missing = DictConfig({"model": L(Point)(x="???")}, flags={"allow_objects": True})
    with pytest.raises(ConfigError, match=r"model\.x has no value \(\?\?\?\).*model\.x=VALUE"):
        instantiate(missing.model)


def test_dump_dataclass_builds_back_the_same_object():
    segment = DSegment(DPoint(1, 2), DPoint(3), tags=(DPoint(5), "a"))
    dumped = dump_dataclass(segment)
    assert dumped["_target_"] == "tests.config.test_lazy.DSegment"
    assert dumped["start"] == {"_target_": "tests.config.test_lazy.DPoint", "x": 1, "y": 2}
    assert instantiate(dumped) == DSegment(DPoint(1, 2), DPoint(3), tags=[DPoint(5), "a"])
    with pytest.raises(TypeError):
        dump_dataclass(DPoint)


# ---- load ---------------------------------------------------------------------------------
def test_load_python_config_with_relative_imports_and_load_rel(tmp_path):
    _write(
        tmp_path / "common" / "base.py",
        """
        from trainkit.config import LazyCall as L
        from tests.config.test_lazy import Point
        train = dict(max_iter=100, amp=dict(enabled=False))
        point = L(Point)(x=1)
        """,
    )
    _write(tmp_path / "common" / "extra.yaml", "extra: {depth: 3}\n")
    main = _write(
        tmp_path / "exp" / "main.py",
        """
        from trainkit.config import LazyConfig
        from ..common.base import train, point
        extra = LazyConfig.load_rel("../common/extra.yaml", "extra")
        train.max_iter = 10
        point.y = 7
        _private = dict(a=1)
        not_a_config = 5
        """,
    )
    cfg = LazyConfig.load(main)
    assert set(cfg) == {"train", "point", "extra"}
    assert cfg.train.max_iter == 10 and cfg.train.amp.enabled is False
    assert instantiate(cfg.point) == Point(1, 7)
    assert cfg.extra.depth == 3
    assert LazyConfig.load(main, "train").max_iter == 10
    train, point = LazyConfig.load(main, ("train", "point"))
    assert isinstance(train, DictConfig) and point.y == 7


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(MissingFileError, match="LazyConfig file not found"):
        LazyConfig.load(str(tmp_path / "none.py"))
    with pytest.raises(ConfigError, match=r"must be a \.py or \.yaml file"):
        LazyConfig.load(_write(tmp_path / "x.txt", "a"))
    bad_yaml = _write(tmp_path / "bad.yaml", "a: [1, 2\nb: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: not a valid YAML file") as info:
        LazyConfig.load(bad_yaml)
    assert "\n" not in str(info.value)
    bad = _write(tmp_path / "bad.py", "a = dict(\n")
    with pytest.raises(ConfigError, match=r"bad\.py:\d+: Python syntax error"):
        LazyConfig.load(bad)
    missing_import = _write(tmp_path / "imp.py", "from .nothing import x\n")
    # ImportError too, as detectron2 raises for a config's bad relative imports.
    with pytest.raises(ImportError, match=r"needs the file .*nothing\.py, which does not exist"):
        LazyConfig.load(missing_import)
    with pytest.raises(ImportError, match=r"relative import of a directory"):
        LazyConfig.load(_write(tmp_path / "dir_import.py", "from . import nothing\n"))
    with pytest.raises(ConfigError, match=r"no top-level value 'trian'\. Did you mean train\?"):
        LazyConfig.load(_write(tmp_path / "t.py", "train = dict(a=1)\n"), "trian")


def test_loading_does_not_patch_the_builtin_import(tmp_path):
    import builtins

    before = builtins.__import__
    LazyConfig.load(_write(tmp_path / "a.py", "import os\nx = dict(sep=os.sep)\n"))
    assert builtins.__import__ is before


# ---- save and reload --------------------------------------------------------------------
def _rich_config():
    return DictConfig(
        {
            "model": L(make_pair)(
                first=L(Point)(x=1, y=2),
                second=[L(Point)(x=3), L(torch.nn.Identity)()],
            ),
            "optimizer": L(torch.optim.SGD)(
                params=L(make_pair)(first="${..lr}"), lr=0.5, momentum=0.9, betas=(0.9, 0.99)
            ),
            "train": {"max_iter": 10, "nested": {"deep": {"list": [1, 2.5, "a", None]}}},
            "empty": {},
        },
        flags={"allow_objects": True},
    )


def test_saved_config_reloads_to_the_same_config(tmp_path):
    cfg = _rich_config()
    first = tmp_path / "a.yaml"
    LazyConfig.save(cfg, str(first))
    reloaded = LazyConfig.load(str(first))
    # Targets come back as import paths; saving again gives the same file.
    assert reloaded.model.first._target_ == "tests.config.test_lazy.Point"
    assert reloaded.optimizer.betas == [0.9, 0.99]
    assert reloaded.optimizer.params.first == 0.5  # the interpolation survived
    assert reloaded.train.nested.deep.list == [1, 2.5, "a", None]
    second = tmp_path / "b.yaml"
    LazyConfig.save(reloaded, str(second))
    assert first.read_text() == second.read_text()
    first_obj, second_obj = instantiate(reloaded.model)
    assert first_obj == Point(1, 2) and isinstance(second_obj[1], torch.nn.Identity)


def test_saved_python_config_file_reloads(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cfg = LazyConfig.load(str(root / "configs" / "shapes" / "cnn_small.py"))
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    reloaded = LazyConfig.load(str(tmp_path / "config.yaml"))
    assert LazyConfig.to_py(reloaded) == LazyConfig.to_py(cfg)
    model = instantiate(reloaded.model)
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in instantiate(cfg.model).parameters()
    )


def _local_function():
    return 1


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (L(lambda: 1)(), "it has no import path"),
        ({"fn": _local_function}, "only a _target_ can be a callable"),
        ({"obj": object()}, "YAML cannot hold it"),
    ],
)
def test_a_config_that_cannot_be_saved_says_which_key_in_one_line(tmp_path, value, why):
    cfg = DictConfig({"a": {"b": value}}, flags={"allow_objects": True})
    target = tmp_path / "c.yaml"
    with pytest.raises(ConfigError) as info:
        LazyConfig.save(cfg, str(target))
    message = str(info.value)
    assert "\n" not in message and "a.b" in message and why in message
    assert not target.exists()  # nothing half-written


def test_a_function_defined_in_the_config_file_is_refused_by_save(tmp_path):
    # detectron2 #3482: it saved such a target and then could not load the file back.
    path = _write(
        tmp_path / "f.py",
        """
        from trainkit.config import LazyCall as L
        def build(x):
            return x
        thing = L(build)(x=1)
        """,
    )
    cfg = LazyConfig.load(path)
    assert instantiate(cfg.thing) == 1
    with pytest.raises(ConfigError, match=r"thing\._target_ .* it has no import path"):
        LazyConfig.save(cfg, str(tmp_path / "out.yaml"))


# ---- overrides ----------------------------------------------------------------------------
def test_overrides_parse_values_as_yaml_and_add_keys_with_plus():
    cfg = _rich_config()
    LazyConfig.apply_overrides(
        cfg,
        [
            "train.max_iter=20",
            "optimizer.lr=0.01",
            "train.nested.deep.list=[3, 4]",
            "+train.new_key=hello",
            "model.second.0.x=8",
        ],
    )
    assert cfg.train.max_iter == 20 and isinstance(cfg.train.max_iter, int)
    assert cfg.optimizer.params.first == 0.01  # the interpolation follows
    assert cfg.train.nested.deep.list == [3, 4]
    assert cfg.train.new_key == "hello"
    assert cfg.model.second[0].x == 8


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        (
            "train.max_iters=5",
            r"unknown config key train\.max_iters .*Did you mean train\.max_iter\?",
        ),
        ("trian.max_iter=5", r"unknown config key trian\.max_iter.*Did you mean train\.max_iter\?"),
        ("train.max_iter 5", r"is not KEY=VALUE"),
        ("~train.max_iter", r"deletes a key, which is not supported"),
        ("train.max_iter.x=1", r"train\.max_iter holds int 10, not a group of keys"),
        ("model.second.5.x=1", r"model\.second is a list of 2 items, so index 5 does not exist"),
    ],
)
def test_bad_overrides_are_one_line_errors(override, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        LazyConfig.apply_overrides(_rich_config(), [override])
    assert "\n" not in str(info.value)
    if "=" in override and not override.startswith("~"):
        # A key that is not there is also a KeyError, as detectron2 raises.
        assert isinstance(info.value, KeyError)
        assert not str(info.value).startswith("'")


def test_to_py_writes_one_line_per_value():
    text = LazyConfig.to_py(_rich_config())
    assert "cfg.train.max_iter = 10\n" in text
    assert (
        "cfg.model = tests.config.test_lazy.make_pair(first=tests.config.test_lazy.Point(" in text
    )
    assert "cfg.optimizer = torch.optim.SGD(betas=[0.9, 0.99], lr=0.5, momentum=0.9" in text


# ---- origins ------------------------------------------------------------------------------
def _rows(cfg):
    return {row.key: row for row in listed_changes(flat_config_items(cfg), origins_of(cfg))}


def test_origins_name_the_file_line_the_imported_file_and_the_command_line(tmp_path):
    _write(
        tmp_path / "common" / "base.py",
        """
        train = dict(
            max_iter=100,
            log_period=20,
        )
        """,
    )
    main = _write(
        tmp_path / "main.py",
        """
        from trainkit.config import LazyCall as L
        from tests.config.test_lazy import Point
        from .common.base import train
        point = L(Point)(
            x=1,
        )
        train.max_iter = 10
        """,
    )
    cfg = LazyConfig.load(main)
    LazyConfig.apply_overrides(cfg, ["point.x=3"])
    rows = _rows(cfg)
    assert rows["train.max_iter"].origin.endswith("main.py:8")  # line 1 is blank
    assert rows["train.log_period"].origin.endswith("base.py:4")
    assert rows["point.x"].origin == "command line" and rows["point.x"].value == 3
    assert rows["point._target_"].value is Point
    assert rows["point._target_"].origin.endswith("main.py:5")
    cfg.train.log_period = 5  # code: the file's origin no longer holds
    assert _rows(cfg)["train.log_period"].origin == "code"


def test_origins_of_computed_values_after_a_relative_import(tmp_path):
    # A computed value: its leaves were set by the line that computed it, nothing appended.
    _write(tmp_path / "common" / "base.py", "train = dict(max_iter=100)\n")
    main = _write(
        tmp_path / "main.py",
        """
        from .common.base import train
        from trainkit import model_zoo
        optimizer = model_zoo.get_config("common/optim.py").SGD
        """,
    )
    cfg = LazyConfig.load(main)
    rows = _rows(cfg)
    assert rows["optimizer.lr"].origin == f"{tmp_path / 'main.py'}:4"
    assert rows["train.max_iter"].origin == f"{tmp_path / 'common' / 'base.py'}:1"


def test_origins_of_a_yaml_file_and_of_an_override_of_a_list_item(tmp_path):
    path = _write(tmp_path / "c.yaml", "train:\n  max_iter: 5\n  steps: [1, 2]\n")
    cfg = LazyConfig.apply_overrides(LazyConfig.load(path), ["train.steps.1=3"])
    rows = _rows(cfg)
    assert rows["train.max_iter"].origin == f"{path}:2"
    assert rows["train.steps"].origin == "command line" and rows["train.steps"].value == [1, 3]


def test_instantiate_builds_the_items_of_a_tuple_in_a_config():
    cfg = LazyConfig.apply_overrides(
        DictConfig({"pair": L(make_pair)(first=(L(Point)(x=1), 2))}, flags={"allow_objects": True}),
        [],
    )
    first, _ = instantiate(cfg.pair)
    assert list(first) == [Point(1), 2]


def test_import_trainkit_config_does_not_import_omegaconf():
    code = "import sys, trainkit.config, trainkit.engine; print('omegaconf' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"

"""detectron2's yacs-config behaviours (tests/config/test_yacs_config.py) through trainkit names.

Out of scope here: config version upgrades of detection keys, OmegaConf and the model zoo.
"""

import inspect

import pytest
import torch
from torch import nn

from trainkit.config import CfgNode, configurable, get_cfg
from trainkit.modeling import META_ARCH_REGISTRY, build_model


def _cfg(**values):
    cfg = get_cfg()
    for key, value in values.items():
        setattr(cfg, key, value)  # new top-level keys, as a yacs user would add them
    return cfg


# ---- classes written the detectron2 way ---------------------------------------------------
class Base(nn.Module):
    @configurable
    def __init__(self, width, depth, scale=3):
        """Base docstring."""
        super().__init__()
        self.width, self.depth, self.scale = width, depth, scale

    @classmethod
    def from_config(cls, cfg):
        return {"width": cfg.WIDTH, "depth": cfg.DEPTH}


class WithShape(Base):
    @configurable
    def __init__(self, shape, width, depth, scale=3):
        """WithShape docstring."""
        super().__init__(width, depth, scale)
        self.shape = shape

    @classmethod
    def from_config(cls, cfg, shape):  # an extra argument only from_config takes
        return {"width": cfg.WIDTH, "depth": cfg.DEPTH, "shape": shape}


class WithShapeVarKw(WithShape):
    @classmethod
    def from_config(cls, cfg, shape, **extra):  # forwards whatever it is given
        return {"width": cfg.WIDTH, "depth": cfg.DEPTH, "shape": shape, **extra}


class InheritsFromConfig(Base):
    # uses Base.from_config, which knows nothing of `shape`: the keyword goes to __init__
    @configurable
    def __init__(self, shape: str, width: int, depth, scale=3):
        super().__init__(width, depth, scale)
        self.shape = shape


class OldStyleChild(WithShape):
    # a subclass that predates @configurable: it takes the config itself
    def __init__(self, cfg, shape, extra=4):
        super().__init__(cfg, shape)
        self.extra = extra


class OldStyleChildOtherName(WithShape):
    def __init__(self, config, shape):
        super().__init__(config, shape)


class NewChild(WithShape):
    @configurable
    def __init__(self, shape, extra=4, **kwargs):
        super().__init__(shape, **kwargs)
        self.extra = extra


def _check(obj, width=1, depth=2, scale=3, shape=None):
    assert (obj.width, obj.depth, obj.scale) == (width, depth, scale)
    if shape is not None:
        assert obj.shape == shape


def test_explicit_arguments_bypass_from_config():
    _check(Base(width=1, depth=2, scale=3))
    _check(Base(1, 2))
    _check(WithShape("s", width=1, depth=2), shape="s")
    _check(WithShapeVarKw("s", width=1, depth=2), shape="s")
    _check(InheritsFromConfig("s", width=1, depth=2, scale=3), shape="s")


def test_decorated_init_keeps_its_metadata():
    assert "WithShape docstring" in WithShape.__init__.__doc__
    assert InheritsFromConfig.__init__.__annotations__["width"] is int
    assert InheritsFromConfig.__init__.__annotations__["shape"] is str
    assert "shape" in str(inspect.signature(WithShape.__init__))


@pytest.mark.parametrize("as_keyword", [False, True])
def test_config_as_first_argument_or_keyword(as_keyword):
    cfg = _cfg(WIDTH=1, DEPTH=2)

    def build(cls, **kwargs):
        return cls(cfg=cfg, **kwargs) if as_keyword else cls(cfg, **kwargs)

    _check(build(Base))
    _check(build(WithShape, shape="s"), shape="s")
    _check(build(WithShapeVarKw, shape="s"), shape="s")
    _check(build(InheritsFromConfig, shape="s"), shape="s")
    _check(build(NewChild, shape="s"), shape="s")
    old = build(OldStyleChild, shape="s")
    _check(old, shape="s")
    assert old.extra == 4


def test_old_style_subclass_whose_parameter_is_not_named_cfg():
    cfg = _cfg(WIDTH=1, DEPTH=2)
    _check(OldStyleChildOtherName(cfg, shape="s"), shape="s")
    _check(OldStyleChildOtherName(config=cfg, shape="s"), shape="s")


def test_positional_argument_is_not_forwarded_to_init():
    cfg = _cfg(WIDTH=1, DEPTH=2)
    # Base.from_config takes only cfg: "s" has nowhere to go, and guessing is refused.
    with pytest.raises(TypeError, match=r"Base\.from_config.*by keyword"):
        InheritsFromConfig(cfg, "s")
    # WithShape.from_config takes `shape`, so the positional form is fine there.
    _check(WithShape(cfg, "s"), shape="s")


def test_keywords_override_what_from_config_derived():
    cfg = _cfg(WIDTH=1, DEPTH=999)
    _check(Base(cfg), depth=999)
    _check(Base(cfg, depth=2, scale=5), scale=5)
    _check(Base(cfg=cfg, depth=2), depth=2)
    _check(WithShape(cfg, shape="s", depth=2), shape="s")
    _check(WithShapeVarKw(cfg, shape="s", depth=2, scale=7), scale=7, shape="s")
    _check(InheritsFromConfig(cfg=cfg, shape="s", depth=2), shape="s")


@pytest.mark.parametrize("cls", [WithShape, WithShapeVarKw, InheritsFromConfig])
def test_unknown_keyword_is_a_type_error(cls):
    cfg = _cfg(WIDTH=1, DEPTH=2)
    with pytest.raises(TypeError, match="no_such_argument"):
        cls(cfg, shape="s", no_such_argument=1)


def test_class_without_from_config():
    class NoFromConfig:
        @configurable
        def __init__(self, a=1):
            self.a = a

    with pytest.raises(AttributeError, match=r"NoFromConfig.*from_config"):
        NoFromConfig(a=1)


def test_from_config_that_is_not_a_classmethod():
    class PlainMethod:
        @configurable
        def __init__(self, a=1):
            self.a = a

        def from_config(self, cfg):
            return {}

    with pytest.raises(TypeError, match="classmethod"):
        PlainMethod(a=1)


def test_from_config_whose_first_parameter_is_not_cfg():
    class WrongName:
        @configurable
        def __init__(self, a=1):
            self.a = a

        @classmethod
        def from_config(cls, config):
            return {}

    with pytest.raises(TypeError, match="'cfg' as its first argument"):
        WrongName(get_cfg())
    assert WrongName(a=2).a == 2  # the explicit form never calls from_config


def test_empty_parentheses_mean_the_bare_decorator():
    class Parens:
        @configurable()
        def __init__(self, a):
            self.a = a

        @classmethod
        def from_config(cls, cfg):
            return {"a": cfg.A}

    assert Parens(_cfg(A=5)).a == 5


# ---- functions -----------------------------------------------------------------------------
@configurable(from_config=lambda cfg, b: {"a": cfg.A, "b": b, "c": cfg.C})
def combine(a, b=2, c=3, d=4):
    return a, b, c, d


def test_function_with_from_config():
    cfg = _cfg(A=10, C=30)
    assert combine(1) == (1, 2, 3, 4)
    assert combine(1, c=5) == (1, 2, 5, 4)
    with pytest.raises(TypeError, match="'b'"):
        combine(cfg)  # from_config needs b
    assert combine(cfg, b=2) == (10, 2, 30, 4)
    assert combine(cfg, 2) == (10, 2, 30, 4)
    assert combine(cfg=cfg, b=2) == (10, 2, 30, 4)
    assert combine(cfg, a=100, b=20) == (100, 20, 30, 4)
    assert combine(cfg, a=100, b=20, d=40) == (100, 20, 30, 40)
    assert combine.from_config(cfg, b=1) == {"a": 10, "b": 1, "c": 30}
    assert combine.__name__ == "combine"


def test_a_dict_is_not_a_config():
    # only a CfgNode selects the config form; a plain dict is an ordinary argument
    assert combine({"A": 1}) == ({"A": 1}, 2, 3, 4)


def test_works_with_a_plain_yacs_or_fvcore_node():
    from fvcore.common.config import CfgNode as FvcoreCfgNode

    node = FvcoreCfgNode({"WIDTH": 1, "DEPTH": 2})
    _check(Base(node))


# ---- new attributes on a config, as in yacs -----------------------------------------------
def test_setting_a_new_attribute_works_as_in_yacs(tmp_path):
    cfg = get_cfg()
    cfg.USER_CUSTOM = 1
    cfg.ARG1 = 1
    cfg.SOLVER.MY_KEY = "x"
    assert cfg.USER_CUSTOM == 1 and cfg["ARG1"] == 1 and cfg.SOLVER.MY_KEY == "x"
    clone = cfg.clone()
    assert clone.USER_CUSTOM == 1 and clone == cfg
    # Once added, the key can be merged like any other, and it survives a dump round trip.
    path = tmp_path / "custom.yaml"
    path.write_text("USER_CUSTOM: 2\nSOLVER:\n  MY_KEY: y\n")
    cfg.merge_from_file(str(path))
    cfg.merge_from_list(["ARG1", "3"])
    assert (cfg.USER_CUSTOM, cfg.SOLVER.MY_KEY, cfg.ARG1) == (2, "y", 3)
    again = CfgNode(CfgNode.load_cfg(cfg.dump()))
    assert again.USER_CUSTOM == 2
    # Fresh defaults do not see keys added to one config.
    assert "USER_CUSTOM" not in get_cfg()


def test_frozen_config_refuses_new_attributes():
    cfg = get_cfg()
    cfg.freeze()
    with pytest.raises(AttributeError):
        cfg.USER_CUSTOM = 1


# ---- build_model with a @configurable architecture -----------------------------------------
@META_ARCH_REGISTRY.register()
class _CompatConfigurableArch(nn.Module):
    @configurable
    def __init__(self, *, num_classes, hidden=8):
        super().__init__()
        self.num_classes = num_classes
        self.fc = nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, num_classes))

    @classmethod
    def from_config(cls, cfg):
        return {"num_classes": cfg.MODEL.NUM_CLASSES, "hidden": cfg.MODEL_HIDDEN}

    def forward(self, batch):
        return {"loss": self.fc(batch).sum()}


def test_build_model_builds_a_configurable_architecture():
    cfg = _cfg(MODEL_HIDDEN=5)
    cfg.MODEL.META_ARCHITECTURE = "_CompatConfigurableArch"
    cfg.MODEL.NUM_CLASSES = 3
    model = build_model(cfg)
    assert isinstance(model, _CompatConfigurableArch)
    assert model.num_classes == 3
    assert model.fc[0].out_features == 5
    assert model.fc[1].weight.device == torch.device("cpu")
    # ... and the same class without any config
    assert _CompatConfigurableArch(num_classes=2).fc[1].out_features == 2

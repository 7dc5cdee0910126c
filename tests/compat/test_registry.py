"""detectron2's ``locate`` and its inverse (tests/test_registry.py) through trainkit names."""

import pytest
import torch

from trainkit.data.samplers import TrainingSampler
from trainkit.modeling import META_ARCH_REGISTRY
from trainkit.utils.registry import Registry, _convert_target_to_string, locate


class Outer:
    class Inner:
        pass


def _round_trip(obj):
    assert locate(_convert_target_to_string(obj)) is obj


def test_registered_architecture():
    _round_trip(META_ARCH_REGISTRY.get("ImageClassifier"))


def test_class_nested_in_a_class_uses_its_qualname():
    assert _convert_target_to_string(Outer.Inner).endswith("Outer.Inner")
    _round_trip(Outer.Inner)


def test_builtins():
    _round_trip(len)
    _round_trip(dict)


def test_torch_optimizer_that_pydoc_cannot_find():
    _round_trip(torch.optim.SGD)
    assert locate("torch.optim.sgd.SGD") is torch.optim.SGD


def test_unknown_name_is_an_import_error():
    with pytest.raises(ImportError, match="asdf"):
        locate("asdf")
    with pytest.raises(ImportError, match="torch.optim.NoSuchOptimizer"):
        locate("torch.optim.NoSuchOptimizer")


def test_path_is_shortened_to_the_package_that_exports_it():
    assert TrainingSampler.__module__ != "trainkit.data"  # defined in a submodule
    name = _convert_target_to_string(TrainingSampler)
    assert name == "trainkit.data.TrainingSampler"
    assert locate(name) is TrainingSampler


def test_registry_is_fvcores_with_a_helpful_miss():
    from fvcore.common.registry import Registry as FvcoreRegistry

    registry = Registry("THINGS")
    assert isinstance(registry, FvcoreRegistry)

    @registry.register()
    class Thing:
        pass

    assert registry.get("Thing") is Thing and "Thing" in registry
    with pytest.raises(KeyError, match=r"Did you mean Thing\?"):
        registry.get("Thnig")

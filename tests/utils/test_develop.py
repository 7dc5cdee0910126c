"""trainkit.utils.develop stand-ins for missing dependencies, and torch_version_utils."""

import pickle

import pytest
import torch

from trainkit.utils.develop import create_dummy_class, create_dummy_func
from trainkit.utils.torch_version_utils import min_torch_version


def test_dummy_class_imports_subclasses_and_raises_import_error_when_used():
    Polygon = create_dummy_class("Polygon", "shapely", "pip install shapely")

    class Mine(Polygon):
        pass

    assert Polygon.__name__ == "Polygon" and not isinstance(object(), Polygon)
    for use in (lambda: Polygon([(0, 0)]), lambda: Mine(), lambda: Polygon.from_bounds):
        with pytest.raises(ImportError) as info:
            use()
        assert str(info.value) == (
            "Polygon needs shapely, which could not be imported; install it to use Polygon. "
            "pip install shapely"
        )
    assert not hasattr(Polygon, "_private") and not hasattr(Polygon, "__wrapped__")


def test_dummy_func_names_every_dependency():
    load = create_dummy_func("load_lvis", ["lvis", "pycocotools"])
    assert load.__name__ == "load_lvis"
    with pytest.raises(ImportError, match="^load_lvis needs lvis, pycocotools, which could not"):
        load("file.json")
    error = pytest.raises(ImportError, load).value
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_min_torch_version():
    release = torch.__version__.split("+")[0]
    assert min_torch_version("1.0")
    assert min_torch_version(release)
    assert not min_torch_version("999.0")
    major, minor = (int(part) for part in release.split(".")[:2])
    assert not min_torch_version(f"{major}.{minor + 1}")

"""The detection-only placeholder mechanism: imports and subclasses work, use explains itself."""

import pickle

import pytest

from trainkit.utils.detection_only import (
    DetectionOnlyError,
    detection_only,
    detection_only_method,
)
from trainkit.utils.errors import UsageError

Widget = detection_only("Widget", "trainkit.structures.widgets", "drawing widgets", "use a gadget")


def test_calling_raises_one_line_usage_error_naming_feature_and_detectron2_path():
    with pytest.raises(DetectionOnlyError) as info:
        Widget(1, key=2)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Widget is detection-only (drawing widgets)")
    assert "detectron2's structures.widgets.Widget" in message
    assert message.endswith("or use a gadget.")
    assert isinstance(info.value, UsageError)


def test_public_attribute_raises_but_private_and_dunder_lookups_do_not():
    with pytest.raises(DetectionOnlyError, match="Widget is detection-only"):
        Widget.XYXY_ABS  # noqa: B018
    assert not hasattr(Widget, "_private")
    assert not hasattr(Widget, "__wrapped__")
    assert Widget.__module__ == "trainkit.structures.widgets"
    assert Widget.__name__ == "Widget"


def test_subclass_and_isinstance_work_instantiating_a_subclass_raises():
    class Mine(Widget):
        pass

    assert not isinstance(object(), Widget)
    with pytest.raises(DetectionOnlyError, match="Widget is detection-only"):
        Mine()


def test_default_advice_and_reason():
    Other = detection_only("Other", "trainkit.evaluation.other", "x")
    with pytest.raises(DetectionOnlyError, match="or port its code into your project"):
        Other()
    Why = detection_only("Why", "trainkit.evaluation.why", "", "do y", reason="not in trainkit")
    with pytest.raises(DetectionOnlyError, match="^Why is not in trainkit: keep using"):
        Why()


def test_method_placeholder():
    class Drawer:
        draw_box = detection_only_method("draw_box", "drawing a box", "utils.visualizer.V")

    assert Drawer.draw_box.__name__ == "draw_box"
    with pytest.raises(DetectionOnlyError, match=r"draw_box is detection-only \(drawing a box\)"):
        Drawer().draw_box((0, 0, 1, 1))


def test_error_pickles_for_launch_to_reraise_in_the_parent():
    with pytest.raises(DetectionOnlyError) as info:
        Widget()
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)


def test_a_table_placeholder_refuses_iteration_and_indexing_but_stays_truthy():
    Table = detection_only("CATEGORIES", "trainkit.data.datasets.lvis_v1_categories", "LVIS")
    with pytest.raises(DetectionOnlyError, match="^CATEGORIES is detection-only"):
        list(Table)
    with pytest.raises(DetectionOnlyError, match="^CATEGORIES is detection-only"):
        Table[0]  # noqa: B018
    assert Table  # no __len__: `if x:` on a placeholder does not raise


def test_a_module_made_callable_raises_as_its_function(monkeypatch):
    import sys
    import types

    from trainkit.utils.detection_only import make_module_callable_as

    module = types.ModuleType("trainkit.layers.widget")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    widget = detection_only("widget", "trainkit.layers", "drawing widgets")
    make_module_callable_as(module.__name__, widget)
    with pytest.raises(DetectionOnlyError) as info:
        module(1, 2)
    assert str(info.value) == str(pytest.raises(DetectionOnlyError, widget).value)
    assert isinstance(module, types.ModuleType) and module.__name__ == "trainkit.layers.widget"

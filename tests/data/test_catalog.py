import pytest

from trainkit.data import DatasetCatalog, MetadataCatalog


@pytest.fixture(autouse=True)
def clean_catalogs():
    # Start empty, and give the built-in registrations back afterwards: other tests use them.
    saved_funcs, saved_meta = dict(DatasetCatalog._entries), dict(MetadataCatalog._entries)
    DatasetCatalog.clear()
    MetadataCatalog.clear()
    yield
    DatasetCatalog.clear()
    MetadataCatalog.clear()
    DatasetCatalog._entries.update(saved_funcs)
    MetadataCatalog._entries.update(saved_meta)


def test_register_get_list_remove():
    DatasetCatalog.register("toy_train", lambda: [{"i": 1}])
    assert DatasetCatalog.get("toy_train") == [{"i": 1}]
    assert DatasetCatalog.list() == ["toy_train"] and "toy_train" in DatasetCatalog
    DatasetCatalog.remove("toy_train")
    assert DatasetCatalog.list() == []


def test_register_twice_is_an_error():
    DatasetCatalog.register("a", list)
    with pytest.raises(ValueError, match="already registered"):
        DatasetCatalog.register("a", list)


def test_unknown_name_lists_registered_names_and_suggests():
    DatasetCatalog.register("coco_2017_train", list)
    DatasetCatalog.register("voc_train", list)
    with pytest.raises(KeyError) as info:
        DatasetCatalog.get("coco_2017_trian")
    message = str(info.value)
    assert "Did you mean 'coco_2017_train'" in message and "'voc_train'" in message


def test_detectron2_builtin_dataset_names_say_trainkit_does_not_register_them():
    DatasetCatalog.register("shapes_train", list)
    with pytest.raises(KeyError) as info:
        DatasetCatalog.get("coco_2017_val_100")
    message = str(info.value)
    assert "\n" not in message and "'shapes_train'" in message
    assert "'coco_2017_val_100' is one of detectron2's builtin datasets" in message
    assert "DatasetCatalog.register(name, func)" in message


def test_metadata_is_set_once():
    meta = MetadataCatalog.get("toy")
    meta.thing_classes = ["a", "b"]
    meta.thing_classes = ["a", "b"]  # same value: fine
    assert MetadataCatalog.get("toy").thing_classes == ["a", "b"]
    with pytest.raises(ValueError, match="thing_classes"):
        meta.thing_classes = ["c"]
    with pytest.raises(AttributeError, match="available: name, thing_classes"):
        _ = meta.evaluator_type
    assert meta.get("evaluator_type", "none") == "none"
    assert MetadataCatalog.list() == ["toy"]
    MetadataCatalog.remove("toy")
    assert MetadataCatalog.list() == []

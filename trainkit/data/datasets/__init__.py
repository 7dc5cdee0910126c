"""Built-in datasets; importing this package registers ``shapes_train`` and ``shapes_val``."""

from __future__ import annotations

from trainkit.data.datasets.shapes import (
    SHAPES_CLASSES,
    get_datasets_root,
    load_shapes,
    register_shapes,
)

__all__ = ["SHAPES_CLASSES", "get_datasets_root", "load_shapes", "register_shapes"]

register_shapes()

"""detectron2's instance masks: detection-only placeholders."""

from trainkit.structures import BitMasks, PolygonMasks, ROIMasks, polygons_to_bitmask
from trainkit.utils.detection_only import detection_only

__all__ = [
    "BitMasks",
    "PolygonMasks",
    "ROIMasks",
    "polygon_area",
    "polygons_to_bitmask",
    "rasterize_polygons_within_box",
]

_PLACEHOLDER_MODULE = True

rasterize_polygons_within_box = detection_only(
    "rasterize_polygons_within_box", __name__, "rasterising instance polygons in a box"
)
polygon_area = detection_only("polygon_area", __name__, "area of instance polygons")

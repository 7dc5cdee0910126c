"""detectron2's instance masks: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "BitMasks",
    "PolygonMasks",
    "ROIMasks",
    "polygon_area",
    "polygons_to_bitmask",
    "rasterize_polygons_within_box",
]

BitMasks = detection_only("BitMasks", __name__, "per-instance bitmap masks")
PolygonMasks = detection_only("PolygonMasks", __name__, "per-instance polygon masks")
ROIMasks = detection_only("ROIMasks", __name__, "masks pasted from box regions")
polygons_to_bitmask = detection_only(
    "polygons_to_bitmask", __name__, "rasterising instance polygons"
)
rasterize_polygons_within_box = detection_only(
    "rasterize_polygons_within_box", __name__, "rasterising instance polygons in a box"
)
polygon_area = detection_only("polygon_area", __name__, "area of instance polygons")

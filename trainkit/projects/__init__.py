"""detectron2's ``projects`` package: a placeholder holding no names.

In detectron2 this package makes the research projects of its repository (PointRend,
DeepLab, Panoptic-DeepLab) importable as ``detectron2.projects.<name>``. trainkit ships none
of them; port the parts you use into your project.
"""

__all__: list[str] = []

_PLACEHOLDER_MODULE = True

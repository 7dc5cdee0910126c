"""detectron2's import path of ``META_ARCH_REGISTRY`` and ``build_model`` (``modeling.build``)."""

from trainkit.modeling.build import META_ARCH_REGISTRY, build_model

__all__ = ["META_ARCH_REGISTRY", "build_model"]

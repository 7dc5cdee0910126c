"""detectron2's meta-architecture package path: the registry and ``build_model``."""

from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY, build_model

__all__ = ["META_ARCH_REGISTRY", "build_model"]

"""Model architectures: the META_ARCH registry, ``build_model`` and the built-in architecture."""

# Imported for its side effect: it registers the built-in "ImageClassifier" (the default
# MODEL.META_ARCHITECTURE), so build_model(get_cfg()) works after `import trainkit.modeling`.
from trainkit.modeling import image_classifier  # noqa: F401
from trainkit.modeling.build import META_ARCH_REGISTRY, build_model, model_device

__all__ = ["META_ARCH_REGISTRY", "build_model", "model_device"]

"""detectron2's general structures, layers and modelling seams, at each of its import paths."""

import importlib

import pytest

PATHS = {
    "trainkit.structures": ["ImageList"],
    "trainkit.structures.image_list": ["ImageList"],
    "trainkit.layers": [
        "ShapeSpec",
        "Conv2d",
        "cat",
        "get_norm",
        "FrozenBatchNorm2d",
        "nonzero_tuple",
        "move_device_like",
        "BatchNorm2d",
        "ConvTranspose2d",
        "Linear",
        "interpolate",
        "ASPP",
        "CNNBlockBase",
        "DepthwiseSeparableConv2d",
    ],
    "trainkit.layers.shape_spec": ["ShapeSpec"],
    "trainkit.layers.wrappers": [
        "Conv2d",
        "cat",
        "nonzero_tuple",
        "move_device_like",
        "shapes_to_tensor",
    ],
    "trainkit.layers.batch_norm": ["FrozenBatchNorm2d", "get_norm", "LayerNorm"],
    "trainkit.modeling": [
        "Backbone",
        "BACKBONE_REGISTRY",
        "build_backbone",
        "META_ARCH_REGISTRY",
        "build_model",
        "ShapeSpec",
        "SEM_SEG_HEADS_REGISTRY",
        "SemanticSegmentor",
        "build_sem_seg_head",
        "detector_postprocess",
    ],
    "trainkit.modeling.backbone": ["Backbone", "BACKBONE_REGISTRY", "build_backbone"],
    "trainkit.modeling.backbone.backbone": ["Backbone"],
    "trainkit.modeling.backbone.build": ["BACKBONE_REGISTRY", "build_backbone"],
    "trainkit.modeling.meta_arch": [
        "META_ARCH_REGISTRY",
        "SEM_SEG_HEADS_REGISTRY",
        "SemanticSegmentor",
        "SemSegFPNHead",
        "build_model",
        "build_sem_seg_head",
    ],
    "trainkit.modeling.meta_arch.semantic_seg": [
        "SEM_SEG_HEADS_REGISTRY",
        "SemanticSegmentor",
        "SemSegFPNHead",
        "build_sem_seg_head",
    ],
    "trainkit.modeling.postprocessing": ["sem_seg_postprocess"],
    "trainkit.layers.aspp": ["ASPP"],
    "trainkit.layers.blocks": ["CNNBlockBase", "DepthwiseSeparableConv2d"],
    "trainkit.solver.lr_scheduler": ["_get_warmup_factor_at_iter"],
    "trainkit.modeling.meta_arch.build": ["META_ARCH_REGISTRY", "build_model"],
    "trainkit.utils.env": ["TORCH_VERSION", "seed_all_rng"],
    "trainkit.solver.build": ["maybe_add_gradient_clipping", "build_optimizer"],
    "trainkit.evaluation": ["SemSegEvaluator"],
    "trainkit.evaluation.sem_seg_evaluation": ["SemSegEvaluator", "load_image_into_numpy_array"],
    "trainkit.utils.visualizer": ["Visualizer", "ColorMode", "VisImage"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_the_import_path_has_its_names(module):
    imported = importlib.import_module(module)
    missing = [name for name in PATHS[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_every_path_gives_the_same_object():
    import trainkit.modeling as modeling
    from trainkit.modeling.backbone.build import BACKBONE_REGISTRY
    from trainkit.modeling.build import META_ARCH_REGISTRY, build_model
    from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY as via_meta_arch

    assert via_meta_arch is META_ARCH_REGISTRY is modeling.META_ARCH_REGISTRY
    assert modeling.meta_arch.build_model is build_model is modeling.build_model
    assert modeling.BACKBONE_REGISTRY is BACKBONE_REGISTRY


def test_torch_version_is_a_tuple_of_ints_like_detectron2s():
    import torch

    from trainkit.utils.env import TORCH_VERSION

    assert isinstance(TORCH_VERSION, tuple) and len(TORCH_VERSION) == 2
    assert all(isinstance(v, int) for v in TORCH_VERSION)
    assert TORCH_VERSION >= (2, 1)
    assert torch.__version__.startswith(f"{TORCH_VERSION[0]}.{TORCH_VERSION[1]}")

"""detectron2's config keys that trainkit carries, so ported configs and ``add_*_config()`` load.

trainkit's own schema (:mod:`trainkit.config.defaults`) holds the keys trainkit reads. A
detectron2 project also reads and extends keys that only detectron2's models use (the
``MODEL.BACKBONE``, ``MODEL.SEM_SEG_HEAD``, ``MODEL.ROI_HEADS``, ... nodes), and its YAML
files set them. :func:`add_detectron2_keys` adds every key of detectron2's
``config/defaults.py`` that trainkit's schema lacks, with detectron2's default value, so
those functions and files work unchanged. Keys both have are left to trainkit's schema; the
porting guide's table says, key by key, whose default is used and why.

Most keys added here are read only by a project's own code. The few trainkit's code reads
are in :data:`READ_BY_TRAINKIT`; a config that sets any other of them is told once, at setup,
that trainkit does not use it (:func:`unused_detectron2_keys`).
"""

from __future__ import annotations

from trainkit.config.cfg_node import CfgNode as CN
from trainkit.config.provenance import flat_leaves

__all__ = [
    "READ_BY_TRAINKIT",
    "add_detectron2_keys",
    "detectron2_only_keys",
    "unused_detectron2_keys",
]

# Keys added here that trainkit's own code reads: DatasetMapper and build_augmentation (the
# INPUT keys), DefaultPredictor (MIN_SIZE_TEST, FORMAT), build_backbone (BACKBONE.NAME),
# SemanticSegmentor and SemSegFPNHead (the SEM_SEG_HEAD keys) and the
# RepeatFactorTrainingSampler (REPEAT_SQRT).
READ_BY_TRAINKIT = frozenset(
    {
        "INPUT.MIN_SIZE_TRAIN",
        "INPUT.MIN_SIZE_TRAIN_SAMPLING",
        "INPUT.MIN_SIZE_TEST",
        "INPUT.RANDOM_FLIP",
        "INPUT.CROP.ENABLED",
        "INPUT.CROP.TYPE",
        "INPUT.CROP.SIZE",
        "INPUT.FORMAT",
        "INPUT.MASK_FORMAT",
        "MODEL.BACKBONE.NAME",
        "MODEL.SEM_SEG_HEAD.NAME",
        "MODEL.SEM_SEG_HEAD.IN_FEATURES",
        "MODEL.SEM_SEG_HEAD.IGNORE_VALUE",
        "MODEL.SEM_SEG_HEAD.NUM_CLASSES",
        "MODEL.SEM_SEG_HEAD.CONVS_DIM",
        "MODEL.SEM_SEG_HEAD.COMMON_STRIDE",
        "MODEL.SEM_SEG_HEAD.NORM",
        "MODEL.SEM_SEG_HEAD.LOSS_WEIGHT",
        "DATALOADER.REPEAT_SQRT",
    }
)


def add_detectron2_keys(cfg: CN) -> None:
    """Add to ``cfg`` every detectron2 default key it does not have, with detectron2's value.

    Keys ``cfg`` already has keep their value. Groups (``MODEL``, ``INPUT``, ...) missing from
    ``cfg`` are created.

    Args:
        cfg: a config, normally trainkit's defaults ``_C`` while they are being built.
    """
    _add_missing(cfg, _detectron2_only())


def detectron2_only_keys() -> frozenset[str]:
    """Return the dotted names of the detectron2 keys that trainkit's own schema lacks.

    Returns:
        Full key names such as ``"MODEL.ROI_HEADS.NUM_CLASSES"``.
    """
    return frozenset(flat_leaves(_detectron2_only()))


def unused_detectron2_keys(cfg: CN) -> list[str]:
    """Return the detectron2-only keys a config file or the command line set, unread by trainkit.

    Values set by code (a project's ``add_*_config()``) have no origin and are left out:
    that code's project reads them.

    Args:
        cfg: the config of a run, with the origins its merges recorded.

    Returns:
        The sorted full names of keys outside :data:`READ_BY_TRAINKIT` whose value came from
        a file or the command line.
    """
    unused = []
    for key in sorted(detectron2_only_keys() - READ_BY_TRAINKIT):
        try:
            origin = cfg.get_origin(key)
        except KeyError:  # a project removed or replaced the node
            continue
        if origin is not None:
            unused.append(key)
    return unused


def _detectron2_only() -> CN:
    # Only keys trainkit's schema lacks: the shared ones are decided in defaults.py.
    _C = CN()
    # Turn on the proposal, mask and keypoint branches of detectron2's R-CNN models.
    _C.MODEL = CN()
    _C.MODEL.LOAD_PROPOSALS = False
    _C.MODEL.MASK_ON = False
    _C.MODEL.KEYPOINT_ON = False

    # ---- Input: read by DatasetMapper / build_augmentation and DefaultPredictor --------
    _C.INPUT = CN()
    # Short side of a training image after ResizeShortestEdge: one of these lengths ("choice")
    # or a length drawn from [min, max] ("range").
    _C.INPUT.MIN_SIZE_TRAIN = (800,)
    _C.INPUT.MIN_SIZE_TRAIN_SAMPLING = "choice"
    # Short side of a test image (DatasetMapper at test time, DefaultPredictor); 0: no resize.
    _C.INPUT.MIN_SIZE_TEST = 800
    # Training flip of build_augmentation: "horizontal", "vertical" or "none".
    _C.INPUT.RANDOM_FLIP = "horizontal"
    # Training crop of build_augmentation (RandomCrop's crop_type and crop_size): fractions of
    # the image for "relative"/"relative_range", pixels for "absolute"/"absolute_range".
    _C.INPUT.CROP = CN({"ENABLED": False})
    _C.INPUT.CROP.TYPE = "relative_range"
    _C.INPUT.CROP.SIZE = [0.9, 0.9]
    # Channel order / PIL mode DatasetMapper and DefaultPredictor give the model ("BGR",
    # "RGB", "L", ...).
    _C.INPUT.FORMAT = "BGR"
    # Instance-mask format of detection annotations: "polygon" or "bitmask".
    _C.INPUT.MASK_FORMAT = "polygon"

    # ---- Datasets and loader --------------------------------------------------------
    # Precomputed proposals, one file per training / test dataset: detection-only.
    _C.DATASETS = CN()
    _C.DATASETS.PROPOSAL_FILES_TRAIN = ()
    _C.DATASETS.PRECOMPUTED_PROPOSAL_TOPK_TRAIN = 2000
    _C.DATASETS.PROPOSAL_FILES_TEST = ()
    _C.DATASETS.PRECOMPUTED_PROPOSAL_TOPK_TEST = 1000
    _C.DATALOADER = CN()
    # RepeatFactorTrainingSampler: square root of threshold / frequency (LVIS) or the ratio.
    _C.DATALOADER.REPEAT_SQRT = True

    # ---- Model parts: carried for compatibility, read only by project code ------------
    # The builder build_backbone() looks up in BACKBONE_REGISTRY; stages frozen by ResNets.
    _C.MODEL.BACKBONE = CN()
    _C.MODEL.BACKBONE.NAME = "build_resnet_backbone"
    _C.MODEL.BACKBONE.FREEZE_AT = 2

    # Feature pyramid: input feature names, width, norm, how levels are combined.
    _C.MODEL.FPN = CN()
    _C.MODEL.FPN.IN_FEATURES = []
    _C.MODEL.FPN.OUT_CHANNELS = 256
    _C.MODEL.FPN.NORM = ""
    _C.MODEL.FPN.FUSE_TYPE = "sum"

    # Detection-only: proposal generator.
    _C.MODEL.PROPOSAL_GENERATOR = CN()
    _C.MODEL.PROPOSAL_GENERATOR.NAME = "RPN"
    _C.MODEL.PROPOSAL_GENERATOR.MIN_SIZE = 0

    # Detection-only: anchors (sizes and aspect ratios per feature level).
    _C.MODEL.ANCHOR_GENERATOR = CN()
    _C.MODEL.ANCHOR_GENERATOR.NAME = "DefaultAnchorGenerator"
    _C.MODEL.ANCHOR_GENERATOR.SIZES = [[32, 64, 128, 256, 512]]
    _C.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [[0.5, 1.0, 2.0]]
    _C.MODEL.ANCHOR_GENERATOR.ANGLES = [[-90, 0, 90]]
    _C.MODEL.ANCHOR_GENERATOR.OFFSET = 0.0

    # Detection-only: region proposal network.
    _C.MODEL.RPN = CN()
    _C.MODEL.RPN.HEAD_NAME = "StandardRPNHead"
    _C.MODEL.RPN.IN_FEATURES = ["res4"]
    _C.MODEL.RPN.BOUNDARY_THRESH = -1
    _C.MODEL.RPN.IOU_THRESHOLDS = [0.3, 0.7]
    _C.MODEL.RPN.IOU_LABELS = [0, -1, 1]
    _C.MODEL.RPN.BATCH_SIZE_PER_IMAGE = 256
    _C.MODEL.RPN.POSITIVE_FRACTION = 0.5
    _C.MODEL.RPN.BBOX_REG_LOSS_TYPE = "smooth_l1"
    _C.MODEL.RPN.BBOX_REG_LOSS_WEIGHT = 1.0
    _C.MODEL.RPN.BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
    _C.MODEL.RPN.SMOOTH_L1_BETA = 0.0
    _C.MODEL.RPN.LOSS_WEIGHT = 1.0
    _C.MODEL.RPN.PRE_NMS_TOPK_TRAIN = 12000
    _C.MODEL.RPN.PRE_NMS_TOPK_TEST = 6000
    _C.MODEL.RPN.POST_NMS_TOPK_TRAIN = 2000
    _C.MODEL.RPN.POST_NMS_TOPK_TEST = 1000
    _C.MODEL.RPN.NMS_THRESH = 0.7
    _C.MODEL.RPN.CONV_DIMS = [-1]

    # Detection-only: ROI heads.
    _C.MODEL.ROI_HEADS = CN()
    _C.MODEL.ROI_HEADS.NAME = "Res5ROIHeads"
    _C.MODEL.ROI_HEADS.NUM_CLASSES = 80
    _C.MODEL.ROI_HEADS.IN_FEATURES = ["res4"]
    _C.MODEL.ROI_HEADS.IOU_THRESHOLDS = [0.5]
    _C.MODEL.ROI_HEADS.IOU_LABELS = [0, 1]
    _C.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 512
    _C.MODEL.ROI_HEADS.POSITIVE_FRACTION = 0.25
    _C.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.05
    _C.MODEL.ROI_HEADS.NMS_THRESH_TEST = 0.5
    _C.MODEL.ROI_HEADS.PROPOSAL_APPEND_GT = True

    # Detection-only: box head.
    _C.MODEL.ROI_BOX_HEAD = CN()
    _C.MODEL.ROI_BOX_HEAD.NAME = ""
    _C.MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_TYPE = "smooth_l1"
    _C.MODEL.ROI_BOX_HEAD.BBOX_REG_LOSS_WEIGHT = 1.0
    _C.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
    _C.MODEL.ROI_BOX_HEAD.SMOOTH_L1_BETA = 0.0
    _C.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 14
    _C.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = 0
    _C.MODEL.ROI_BOX_HEAD.POOLER_TYPE = "ROIAlignV2"
    _C.MODEL.ROI_BOX_HEAD.NUM_FC = 0
    _C.MODEL.ROI_BOX_HEAD.FC_DIM = 1024
    _C.MODEL.ROI_BOX_HEAD.NUM_CONV = 0
    _C.MODEL.ROI_BOX_HEAD.CONV_DIM = 256
    _C.MODEL.ROI_BOX_HEAD.NORM = ""
    _C.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG = False
    _C.MODEL.ROI_BOX_HEAD.TRAIN_ON_PRED_BOXES = False
    _C.MODEL.ROI_BOX_HEAD.USE_FED_LOSS = False
    _C.MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE = False
    _C.MODEL.ROI_BOX_HEAD.FED_LOSS_FREQ_WEIGHT_POWER = 0.5
    _C.MODEL.ROI_BOX_HEAD.FED_LOSS_NUM_CLASSES = 50

    # Detection-only: cascade stages (one entry per stage).
    _C.MODEL.ROI_BOX_CASCADE_HEAD = CN()
    _C.MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS = (
        (10.0, 10.0, 5.0, 5.0),
        (20.0, 20.0, 10.0, 10.0),
        (30.0, 30.0, 15.0, 15.0),
    )
    _C.MODEL.ROI_BOX_CASCADE_HEAD.IOUS = (0.5, 0.6, 0.7)

    # Detection-only: mask head.
    _C.MODEL.ROI_MASK_HEAD = CN()
    _C.MODEL.ROI_MASK_HEAD.NAME = "MaskRCNNConvUpsampleHead"
    _C.MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION = 14
    _C.MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO = 0
    _C.MODEL.ROI_MASK_HEAD.NUM_CONV = 0
    _C.MODEL.ROI_MASK_HEAD.CONV_DIM = 256
    _C.MODEL.ROI_MASK_HEAD.NORM = ""
    _C.MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK = False
    _C.MODEL.ROI_MASK_HEAD.POOLER_TYPE = "ROIAlignV2"

    # Detection-only: keypoint head (17 keypoints: COCO's).
    _C.MODEL.ROI_KEYPOINT_HEAD = CN()
    _C.MODEL.ROI_KEYPOINT_HEAD.NAME = "KRCNNConvDeconvUpsampleHead"
    _C.MODEL.ROI_KEYPOINT_HEAD.POOLER_RESOLUTION = 14
    _C.MODEL.ROI_KEYPOINT_HEAD.POOLER_SAMPLING_RATIO = 0
    _C.MODEL.ROI_KEYPOINT_HEAD.CONV_DIMS = (512,) * 8
    _C.MODEL.ROI_KEYPOINT_HEAD.NUM_KEYPOINTS = 17
    _C.MODEL.ROI_KEYPOINT_HEAD.MIN_KEYPOINTS_PER_IMAGE = 1
    _C.MODEL.ROI_KEYPOINT_HEAD.NORMALIZE_LOSS_BY_VISIBLE_KEYPOINTS = True
    _C.MODEL.ROI_KEYPOINT_HEAD.LOSS_WEIGHT = 1.0
    _C.MODEL.ROI_KEYPOINT_HEAD.POOLER_TYPE = "ROIAlignV2"

    # Semantic-segmentation head: the node segmentation projects' add_*_config() extend.
    # IGNORE_VALUE is the label of pixels without a loss.
    _C.MODEL.SEM_SEG_HEAD = CN()
    _C.MODEL.SEM_SEG_HEAD.NAME = "SemSegFPNHead"
    _C.MODEL.SEM_SEG_HEAD.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    _C.MODEL.SEM_SEG_HEAD.IGNORE_VALUE = 255
    _C.MODEL.SEM_SEG_HEAD.NUM_CLASSES = 54
    _C.MODEL.SEM_SEG_HEAD.CONVS_DIM = 128
    _C.MODEL.SEM_SEG_HEAD.COMMON_STRIDE = 4
    _C.MODEL.SEM_SEG_HEAD.NORM = "GN"
    _C.MODEL.SEM_SEG_HEAD.LOSS_WEIGHT = 1.0

    # Detection-only: panoptic FPN (instance loss weight, merging of things and stuff).
    _C.MODEL.PANOPTIC_FPN = CN()
    _C.MODEL.PANOPTIC_FPN.INSTANCE_LOSS_WEIGHT = 1.0
    _C.MODEL.PANOPTIC_FPN.COMBINE = CN({"ENABLED": True})
    _C.MODEL.PANOPTIC_FPN.COMBINE.OVERLAP_THRESH = 0.5
    _C.MODEL.PANOPTIC_FPN.COMBINE.STUFF_AREA_LIMIT = 4096
    _C.MODEL.PANOPTIC_FPN.COMBINE.INSTANCES_CONFIDENCE_THRESH = 0.5

    # Detection-only: RetinaNet.
    _C.MODEL.RETINANET = CN()
    _C.MODEL.RETINANET.NUM_CLASSES = 80
    _C.MODEL.RETINANET.IN_FEATURES = ["p3", "p4", "p5", "p6", "p7"]
    _C.MODEL.RETINANET.NUM_CONVS = 4
    _C.MODEL.RETINANET.IOU_THRESHOLDS = [0.4, 0.5]
    _C.MODEL.RETINANET.IOU_LABELS = [0, -1, 1]
    _C.MODEL.RETINANET.PRIOR_PROB = 0.01
    _C.MODEL.RETINANET.SCORE_THRESH_TEST = 0.05
    _C.MODEL.RETINANET.TOPK_CANDIDATES_TEST = 1000
    _C.MODEL.RETINANET.NMS_THRESH_TEST = 0.5
    _C.MODEL.RETINANET.BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
    _C.MODEL.RETINANET.FOCAL_LOSS_GAMMA = 2.0
    _C.MODEL.RETINANET.FOCAL_LOSS_ALPHA = 0.25
    _C.MODEL.RETINANET.SMOOTH_L1_LOSS_BETA = 0.1
    _C.MODEL.RETINANET.BBOX_REG_LOSS_TYPE = "smooth_l1"
    _C.MODEL.RETINANET.NORM = ""

    # detectron2's ResNet / ResNeXt backbone (trainkit has no ResNet: project code only).
    _C.MODEL.RESNETS = CN()
    _C.MODEL.RESNETS.DEPTH = 50
    _C.MODEL.RESNETS.OUT_FEATURES = ["res4"]
    _C.MODEL.RESNETS.NUM_GROUPS = 1
    _C.MODEL.RESNETS.NORM = "FrozenBN"
    _C.MODEL.RESNETS.WIDTH_PER_GROUP = 64
    _C.MODEL.RESNETS.STRIDE_IN_1X1 = True
    _C.MODEL.RESNETS.RES5_DILATION = 1
    _C.MODEL.RESNETS.RES2_OUT_CHANNELS = 256
    _C.MODEL.RESNETS.STEM_OUT_CHANNELS = 64
    _C.MODEL.RESNETS.DEFORM_ON_PER_STAGE = [False, False, False, False]
    _C.MODEL.RESNETS.DEFORM_MODULATED = False
    _C.MODEL.RESNETS.DEFORM_NUM_GROUPS = 1

    # ---- Test -----------------------------------------------------------------------
    _C.TEST = CN()
    # Detection-only: COCO keypoint sigmas and the cap on detections per image.
    _C.TEST.KEYPOINT_OKS_SIGMAS = []
    _C.TEST.DETECTIONS_PER_IMAGE = 100
    # Detection-only: test-time augmentation of GeneralizedRCNNWithTTA.
    _C.TEST.AUG = CN({"ENABLED": False})
    _C.TEST.AUG.MIN_SIZES = (400, 500, 600, 700, 800, 900, 1000, 1100, 1200)
    _C.TEST.AUG.MAX_SIZE = 4000
    _C.TEST.AUG.FLIP = True

    # ---- Misc -----------------------------------------------------------------------
    # Period of detectron2's R-CNN training visualisations; 0 disables them.
    _C.VIS_PERIOD = 0
    # torch float32 matmul precision ("", "highest", "high", "medium") that detectron2's
    # default_setup applies; "" leaves torch's setting.
    _C.FLOAT32_PRECISION = ""

    return _C


def _add_missing(dst: CN, src: CN) -> None:
    # Existing keys keep their value (and type): trainkit's schema decides those.
    for key, value in src.items():
        if key not in dst:
            dst[key] = value
        elif isinstance(value, CN) and isinstance(dst[key], CN):
            _add_missing(dst[key], value)

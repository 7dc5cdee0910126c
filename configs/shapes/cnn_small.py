"""The main job as a LazyConfig: cnn_small.yaml's model, data and schedule, as objects.

    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py
    python tools/lazyconfig_train_net.py --config-file configs/shapes/cnn_small.py \
        train.max_iter=100 train.output_dir=/tmp/run

The values are those of configs/shapes/cnn_small.yaml with ../Base-Shapes.yaml, for one
process. Unlike the YAML it is not rescaled with --num-gpus (detectron2's LazyConfigs are
not): the batch is the total over the processes, and the lr and the length stay as written.
"""

from fvcore.common.param_scheduler import CosineParamScheduler

from trainkit import model_zoo
from trainkit.config import LazyCall as L
from trainkit.data import (
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.evaluation import ClassificationEvaluator
from trainkit.modeling.image_classifier import ImageClassifier
from trainkit.solver import WarmupParamScheduler

model = L(ImageClassifier)(
    num_classes=6,
    channels=[16, 32, 64, 128],
    # Two 3x3 convs per stage: four stages then see the whole (<= 64 px) image.
    convs_per_stage=2,
    # Shape and background colours are random: standardise each image on its own.
    input_norm="image",
    pool="avgmax",
)

dataloader = dict(
    train=L(build_detection_train_loader)(
        dataset=L(get_detection_dataset_dicts)(names="shapes_train"),
        # The mapper of tools/train_net.py, with Base-Shapes.yaml's INPUT values.
        mapper=L(ClassificationDatasetMapper)(
            is_train=True,
            flip_prob=0.5,
            scale_range=[0.8, 1.2],
            max_size_train=64,
            scale_per_batch=True,
        ),
        total_batch_size=32,
        aspect_ratio_grouping=True,
        aspect_ratio_bins=[0.5, 0.75, 1.0, 1.333, 2.0],
        num_workers=2,
        # The data order and sample_rng() are keyed by this seed: fixed, so a resume
        # continues the same stream.
        seed="${train.seed}",
    ),
    test=L(build_detection_test_loader)(
        dataset=L(get_detection_dataset_dicts)(names="shapes_val", filter_empty=False),
        mapper=L(ClassificationDatasetMapper)(is_train=False, max_size_test=64),
        batch_size=32,
        num_workers=2,
    ),
    evaluator=L(ClassificationEvaluator)(dataset_name="shapes_val"),
)

# SOLVER.OPTIMIZER "AdamW" with the param groups of solver.build_optimizer.
optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.lr = 0.002
optimizer.weight_decay = 1e-4

# WarmupCosineLR to 0 after a linear warm-up of 75 of the 1500 iterations from 1 % of the lr.
lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(CosineParamScheduler)(start_value=1.0, end_value=0.0),
    warmup_length=75 / 1500,
    warmup_factor=0.01,
    warmup_method="linear",
)

train = model_zoo.get_config("common/train.py").train
train.output_dir = "./output/shapes_cnn_small_lazy"
train.max_iter = 1500
train.checkpointer = dict(period=500, max_to_keep=2)
# Only after training: the whole run takes about 1.5 minutes.
train.eval_period = 0
train.log_period = 20
train.seed = 0
train.device = "cpu"

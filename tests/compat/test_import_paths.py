"""Every detectron2 import path trainkit kept through the layout change still imports.

detectron2 scripts move over by changing ``detectron2`` to ``trainkit`` in their imports, so
each module path below (detectron2's, or trainkit's own from earlier rounds) must keep its
names wherever the code behind them moved (``train_loop``, ``defaults``, ``launch`` and
``config.config`` are such paths now: the classes live in modules of their own).
"""

import importlib

import pytest

PATHS = {
    "trainkit.config": ["CfgNode", "get_cfg", "configurable"],
    "trainkit.config.config": ["CfgNode", "get_cfg", "configurable"],
    "trainkit.engine": [
        "DefaultTrainer",
        "SimpleTrainer",
        "AMPTrainer",
        "TrainerBase",
        "HookBase",
        "hooks",
        "launch",
        "default_argument_parser",
        "default_setup",
        "default_writers",
        "create_ddp_model",
    ],
    "trainkit.engine.defaults": [
        "DefaultTrainer",
        "default_argument_parser",
        "default_setup",
        "default_writers",
        "create_ddp_model",
    ],
    "trainkit.engine.train_loop": ["TrainerBase", "SimpleTrainer", "AMPTrainer", "HookBase"],
    "trainkit.engine.hooks": [
        "CallbackHook",
        "IterationTimer",
        "PeriodicWriter",
        "PeriodicCheckpointer",
        "BestCheckpointer",
        "LRScheduler",
        "EvalHook",
        "PreciseBN",
        "TorchProfiler",
        "TorchMemoryStats",
        "HookBase",
    ],
    "trainkit.engine.launch": ["launch"],
    "trainkit.data": [
        "DatasetCatalog",
        "MetadataCatalog",
        "build_detection_train_loader",
        "build_detection_test_loader",
        "build_batch_data_loader",
        "get_detection_dataset_dicts",
        "DatasetFromList",
        "MapDataset",
        "ToIterableDataset",
    ],
    "trainkit.data.build": [
        "build_batch_data_loader",
        "build_detection_train_loader",
        "build_detection_test_loader",
        "trivial_batch_collator",
        "worker_init_reset_seed",
        "get_detection_dataset_dicts",
    ],
    "trainkit.data.common": [
        "DatasetFromList",
        "MapDataset",
        "ToIterableDataset",
        "AspectRatioGroupedDataset",
        "set_default_dataset_from_list_serialize_method",
    ],
    "trainkit.data.samplers": [
        "TrainingSampler",
        "RandomSubsetTrainingSampler",
        "RepeatFactorTrainingSampler",
        "InferenceSampler",
        "GroupedBatchSampler",
    ],
    "trainkit.data.catalog": ["DatasetCatalog", "MetadataCatalog", "Metadata"],
    "trainkit.checkpoint": ["DetectionCheckpointer", "Checkpointer", "PeriodicCheckpointer"],
    "trainkit.solver": [
        "build_optimizer",
        "build_lr_scheduler",
        "get_default_optimizer_params",
        "LRMultiplier",
        "WarmupParamScheduler",
        "WarmupMultiStepLR",
        "WarmupCosineLR",
    ],
    "trainkit.solver.build": [
        "build_optimizer",
        "build_lr_scheduler",
        "get_default_optimizer_params",
        "reduce_param_groups",
    ],
    "trainkit.solver.lr_scheduler": [
        "WarmupParamScheduler",
        "LRMultiplier",
        "WarmupMultiStepLR",
        "WarmupCosineLR",
    ],
    "trainkit.evaluation": [
        "DatasetEvaluator",
        "DatasetEvaluators",
        "inference_on_dataset",
        "inference_context",
        "print_csv_format",
        "verify_results",
    ],
    "trainkit.evaluation.evaluator": [
        "DatasetEvaluator",
        "DatasetEvaluators",
        "inference_on_dataset",
        "inference_context",
    ],
    "trainkit.evaluation.testing": ["print_csv_format", "verify_results"],
    "trainkit.modeling": ["META_ARCH_REGISTRY", "build_model"],
    "trainkit.utils.comm": [
        "get_world_size",
        "get_rank",
        "get_local_rank",
        "get_local_size",
        "is_main_process",
        "synchronize",
        "create_local_process_group",
        "get_local_process_group",
        "all_gather",
        "gather",
        "shared_random_seed",
        "reduce_dict",
    ],
    "trainkit.utils.events": [
        "EventStorage",
        "get_event_storage",
        "EventWriter",
        "CommonMetricPrinter",
        "JSONWriter",
        "TensorboardXWriter",
        "has_event_storage",
    ],
    "trainkit.utils.logger": ["setup_logger", "log_first_n", "log_every_n", "log_every_n_seconds"],
    "trainkit.utils.env": ["seed_all_rng"],
    "trainkit.utils.registry": ["Registry", "locate"],
    "trainkit.utils.serialize": ["PicklableWrapper"],
    "trainkit.utils.collect_env": ["collect_env_info"],
    "trainkit.utils.file_io": ["PathManager"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_the_import_path_keeps_its_names(module):
    imported = importlib.import_module(module)
    missing = [name for name in PATHS[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lost {missing}"

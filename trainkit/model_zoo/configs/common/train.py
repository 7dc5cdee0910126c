"""Training settings that tools/lazyconfig_train_net.py reads, under detectron2's keys.

Use them in a config with ``train = model_zoo.get_config("common/train.py").train`` (or a
relative import) and change what differs: ``train.max_iter = 2000``.
"""

import torch

train = dict(
    output_dir="./output",
    # Weights to start from; "" trains from scratch. trainkit has no model zoo weights, so
    # detectron2's "detectron2://ImageNetPretrained/..." defaults do not apply.
    init_checkpoint="",
    max_iter=90000,
    # Automatic mixed precision: AMPTrainer instead of SimpleTrainer.
    amp=dict(enabled=False),
    # Arguments of create_ddp_model (DistributedDataParallel) with several processes.
    ddp=dict(broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    # Shard the model with FSDP2 instead of DDP (MODEL.FSDP.* in a yacs config); ddp is then
    # not used.
    fsdp=dict(enabled=False, shard_size=0, reshard_after_forward=True),
    # Arguments of hooks.PeriodicCheckpointer: save every `period` iterations, keep the last
    # `max_to_keep` periodic checkpoints.
    checkpointer=dict(period=5000, max_to_keep=100),
    # Evaluate every eval_period iterations and at the end (0: only at the end).
    eval_period=5000,
    # Write metrics (console, metrics.json, TensorBoard) every log_period iterations.
    log_period=20,
    # Beyond detectron2's file, which default_setup reads anyway: the seed of every rank's
    # random generators (rank added); < 0 draws one.
    seed=-1,
    # Config files are Python: a machine without a GPU gets the CPU instead of an error.
    device="cuda" if torch.cuda.is_available() else "cpu",
)

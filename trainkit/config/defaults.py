"""The config schema: every key trainkit reads, with its default, meaning, unit and valid values.

The merge is strict: a key not here cannot be set from a file or the command line, so a new
key is added here, with a comment. detectron2's keys that trainkit does not have are added to
the same ``_C`` at the end, from :mod:`trainkit.config.detectron2_defaults`. Where a key is
in both, the default here is detectron2's unless a comment gives the reason
(docs/porting_from_detectron2.md has the table).
"""

from __future__ import annotations

from trainkit.config.cfg_node import CfgNode as CN
from trainkit.config.detectron2_defaults import add_detectron2_keys

_C = CN()

# Schema version of config files (detectron2's current one, compat.LATEST_VERSION). A file
# of an older version (0 or 1, or without VERSION but with MODEL.WEIGHT) has its renamed keys
# upgraded when merged, as in detectron2 (trainkit.config.compat).
_C.VERSION = 2

# ---- Model ------------------------------------------------------------------------------
_C.MODEL = CN()
# Device the model is built on: "cuda" (launch() picks the GPU from the local rank) or "cpu".
# Not detectron2's "cuda": trainkit's default has to run on any machine (a CPU-only one fails
# at build_model with "cuda"); set "cuda" to train on GPUs.
_C.MODEL.DEVICE = "cpu"
# Convert the model's 4-D weights to channels-last (NHWC) memory when it is built, and (the
# built-in ImageClassifier) its padded input batch too: convolutions then run in the layout
# tensor cores prefer. Same results to rounding; a model without 4-D weights is warned about.
_C.MODEL.CHANNELS_LAST = False
# Name of a META_ARCH_REGISTRY entry that build_model() instantiates with the cfg.
_C.MODEL.META_ARCHITECTURE = "ImageClassifier"
# Path or URL of weights to load before training or for --eval-only; "" means none.
_C.MODEL.WEIGHTS = ""
# Entries of MODEL.WEIGHTS (or of the checkpoint --resume loads) whose shapes differ from the
# model stop the run with the list of them. True skips them with a warning instead and
# leaves those layers as initialised: fine-tuning weights trained for other classes.
_C.MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH = False
# Number of output classes for classification models.
_C.MODEL.NUM_CLASSES = 6
# Per-channel pixel mean and std (0-255 scale, in INPUT.FORMAT's channel order) that models
# normalise inputs with. detectron2's: ImageNet's mean in BGR order, std 1 (absorbed into the
# weights of its pretrained backbones). The ImageClassifier reads them only with
# CLASSIFIER.INPUT_NORM "pixel", on RGB images: give RGB values then.
_C.MODEL.PIXEL_MEAN = [103.530, 116.280, 123.675]
_C.MODEL.PIXEL_STD = [1.0, 1.0, 1.0]

# Options of the built-in ImageClassifier; INPUT_NORM and LABEL_SMOOTHING are also the
# ViTClassifier's.
_C.MODEL.CLASSIFIER = CN()
# Output channels of each conv stage (each stage halves the resolution).
_C.MODEL.CLASSIFIER.CHANNELS = [16, 32, 64, 96]
# Padded sizes are rounded up to a multiple of this many pixels.
_C.MODEL.CLASSIFIER.SIZE_DIVISIBILITY = 16
# 3x3 convs per stage (>= 1): the first has stride 2, the others stride 1. Two per stage
# give the receptive field needed to see a whole object in a few stages. Also the convs per
# stage of ViTClassifier's stem (MODEL.VIT.STEM_CHANNELS).
_C.MODEL.CLASSIFIER.CONVS_PER_STAGE = 2
# Input normalisation: "image" standardises each image by its own per-channel mean and
# overall std (removes background colour and contrast); "pixel" uses PIXEL_MEAN/PIXEL_STD.
_C.MODEL.CLASSIFIER.INPUT_NORM = "image"
# Global pooling before the linear head: "avg", "max", or "avgmax" (both, concatenated).
_C.MODEL.CLASSIFIER.POOL = "avgmax"
# Label smoothing of the cross-entropy loss, in [0, 1); 0 is plain cross-entropy.
_C.MODEL.CLASSIFIER.LABEL_SMOOTHING = 0.0

# Options of the built-in ViTClassifier (MODEL.META_ARCHITECTURE "ViTClassifier"), a Vision
# Transformer whose blocks are its FSDP and activation-checkpointing units. Its position
# embeddings cover the largest image INPUT.MAX_SIZE_TRAIN/TEST and RANDOM_SCALE allow.
_C.MODEL.VIT = CN()
# Side of the square patches, in pixels (>= 1): one token per patch; images are padded to
# a multiple of it.
_C.MODEL.VIT.PATCH_SIZE = 8
# Output channels of each stage of a convolutional stem before the patch embedding (the ViT
# paper's "hybrid"): per entry, a stage of MODEL.CLASSIFIER.CONVS_PER_STAGE 3x3 convs (the
# first of stride 2) with masked batch norm and ReLU, as ImageClassifier's stages. [] (no
# stem) embeds the raw pixels of each patch linearly; with a stem the patch embedding is a
# conv of kernel and stride PATCH_SIZE / 2**len(STEM_CHANNELS), so PATCH_SIZE must be
# divisible by 2**len(STEM_CHANNELS). E.g. [16, 32]: two stages, stride 4.
_C.MODEL.VIT.STEM_CHANNELS = []
# Width of the tokens (>= 1, a multiple of HEADS).
_C.MODEL.VIT.DIM = 64
# Number of transformer blocks (>= 1).
_C.MODEL.VIT.DEPTH = 4
# Attention heads per block (>= 1); each head has DIM / HEADS channels.
_C.MODEL.VIT.HEADS = 4
# Hidden units of each block's MLP as a multiple of DIM (> 0).
_C.MODEL.VIT.MLP_RATIO = 2.0

# torch.compile of the model's tensor-in, tensor-out part (the methods its compiled_methods
# names; see trainkit.modeling.compile). Batches are then padded to the few shapes the
# padding rule plans from INPUT.MAX_SIZE_*, RANDOM_SCALE, ASPECT_RATIO_BINS and the batch
# sizes (trainkit.modeling.shape_plan), so the number of graphs is known at start.
_C.MODEL.COMPILE = CN()
# Compile the model (default off: the first steps then take minutes on a CPU).
_C.MODEL.COMPILE.ENABLED = False
# torch.compile's mode: "" (its default), "reduce-overhead", "max-autotune" or
# "max-autotune-no-cudagraphs"; only with BACKEND "inductor".
_C.MODEL.COMPILE.MODE = ""
# torch.compile's backend: "inductor" (generates code); "aot_eager" or "eager" only trace
# (for checking that a model compiles, quickly).
_C.MODEL.COMPILE.BACKEND = "inductor"
# Directory of the inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR); "" means
# OUTPUT_DIR/compile_cache, where a restarted or resumed run finds its graphs again. An
# environment variable TORCHINDUCTOR_CACHE_DIR set by the user wins.
_C.MODEL.COMPILE.CACHE_DIR = ""

# Sharding the model over the processes with FSDP2 (torch.distributed.fsdp.fully_shard)
# instead of replicating it with DDP: each process holds a 1/N share of the parameters,
# gradients and optimizer state (see docs/distributed.md). Checkpoints are then directories
# written by torch.distributed.checkpoint, each process writing its shards.
_C.MODEL.FSDP = CN()
# Shard the model (also with one process, where it only changes the checkpoint format).
_C.MODEL.FSDP.ENABLED = False
# Processes per shard group: 0 (or the world size) shards over every process; a divisor N > 1
# of the processes per machine shards inside groups of N and replicates across them (hybrid
# sharding on a 2-D device mesh: less traffic between machines, more memory per process).
_C.MODEL.FSDP.SHARD_SIZE = 0
# Free each block's gathered parameters after its forward pass and gather them again for
# the backward pass (less memory); False keeps them (more memory, one gather less per step).
_C.MODEL.FSDP.RESHARD_AFTER_FORWARD = True
# Recompute each block's activations in the backward pass instead of keeping them (less
# memory, about a third more compute); the blocks are the model's block_modules. With or
# without FSDP.
_C.MODEL.ACTIVATION_CHECKPOINTING = False

# ---- Input (the built-in mapper) --------------------------------------------------------
_C.INPUT = CN()
# Probability of a horizontal flip of a training image; 0 disables it.
_C.INPUT.RANDOM_FLIP_PROB = 0.5
# Training images are rescaled by a factor drawn uniformly from this [min, max] range.
_C.INPUT.RANDOM_SCALE = [0.8, 1.2]
# Draw that factor once per batch (every image of a batch rescaled alike) rather than once
# per image. With aspect-ratio grouping the images of a batch then also share their size,
# so little padding is left (the shapes dataset: 14 % instead of 32 % of the pixels).
_C.INPUT.RANDOM_SCALE_PER_BATCH = True
# Longest side (pixels) of a training image. The built-in mapper shrinks a larger image to it
# before the random rescale and keeps smaller ones (0: no cap); detectron2's
# ResizeShortestEdge (build_augmentation) caps the side after resizing to MIN_SIZE_TRAIN.
_C.INPUT.MAX_SIZE_TRAIN = 1333
# Longest side (pixels) of a test image, in the same two ways (MIN_SIZE_TEST for the second).
_C.INPUT.MAX_SIZE_TEST = 1333

# ---- Datasets ---------------------------------------------------------------------------
_C.DATASETS = CN()
# Names registered in DatasetCatalog used for training (concatenated) and for testing.
_C.DATASETS.TRAIN = ()
# Weights of the DATASETS.TRAIN entries (one float > 0 each) to mix them: every optimizer
# step then holds each set's exact integer share of SOLVER.IMS_PER_BATCH (largest remainder
# with a carry) and each set keeps its own epochs (docs/data_at_scale.md, "Mixing several
# training sets"). () concatenates them. Map-style datasets and the TrainingSampler only.
_C.DATASETS.TRAIN_WEIGHTS = ()
_C.DATASETS.TEST = ()

# ---- Data loader ------------------------------------------------------------------------
_C.DATALOADER = CN()
# Loader worker processes per rank; 0 loads in the training process.
_C.DATALOADER.NUM_WORKERS = 4
# Group training samples into batches of similar aspect ratio (decided from the records'
# width/height before loading; see ASPECT_RATIO_BINS).
_C.DATALOADER.ASPECT_RATIO_GROUPING = True
# Boundaries of the aspect-ratio (width / height) buckets used by grouping, increasing.
# N boundaries give N + 1 buckets; [1.0] reproduces detectron2's two orientation buckets.
_C.DATALOADER.ASPECT_RATIO_BINS = [0.5, 0.75, 1.0, 1.333, 2.0]
# Drop images with no annotations (kept for detectron2 compatibility; unused by classifiers).
_C.DATALOADER.FILTER_EMPTY_ANNOTATIONS = True
# Training sampler: "TrainingSampler", "RepeatFactorTrainingSampler" or
# "RandomSubsetTrainingSampler".
_C.DATALOADER.SAMPLER_TRAIN = "TrainingSampler"
# RepeatFactorTrainingSampler: repeat images whose rarest category is below this frequency.
_C.DATALOADER.REPEAT_THRESHOLD = 0.0
# RandomSubsetTrainingSampler: fraction (0, 1] of the dataset to train on.
_C.DATALOADER.RANDOM_SUBSET_RATIO = 1.0
# Batches each worker prepares ahead (torch DataLoader's prefetch_factor); needs workers.
_C.DATALOADER.PREFETCH_FACTOR = 2
# Keep workers alive between loader iterations.
_C.DATALOADER.PERSISTENT_WORKERS = False
# Copy batches into page-locked memory (faster host-to-GPU copies); only useful with CUDA.
_C.DATALOADER.PIN_MEMORY = False
# With MODEL.DEVICE cuda, copy the next batch's tensors to the GPU on a side stream while the
# current step runs (pinned first if PIN_MEMORY did not pin them; one copy per dtype). The
# model then gets its inputs on the GPU. Off: the model copies them itself. No effect on the
# CPU. Checkpoints record only the batches consumed, so resuming is exact either way.
_C.DATALOADER.PREFETCH_TO_DEVICE = True
# Consecutive records that may fail to load before the loader gives up with an error.
_C.DATALOADER.MAX_CONSECUTIVE_FAILURES = 20

# ---- Solver -----------------------------------------------------------------------------
_C.SOLVER = CN()
# Optimizer: "SGD" (with MOMENTUM, NESTEROV) or "AdamW" (with BETAS, EPS).
_C.SOLVER.OPTIMIZER = "SGD"
# Images per optimizer step summed over all ranks (not per GPU).
_C.SOLVER.IMS_PER_BATCH = 16
# Learning rate for IMS_PER_BATCH images per step.
_C.SOLVER.BASE_LR = 0.001
# SGD momentum and Nesterov switch.
_C.SOLVER.MOMENTUM = 0.9
_C.SOLVER.NESTEROV = False
# AdamW betas and epsilon.
_C.SOLVER.BETAS = (0.9, 0.999)
_C.SOLVER.EPS = 1e-8
# L2 weight decay of weights; of normalisation layers' parameters; of biases (None: same
# as WEIGHT_DECAY).
_C.SOLVER.WEIGHT_DECAY = 0.0001
_C.SOLVER.WEIGHT_DECAY_NORM = 0.0
_C.SOLVER.WEIGHT_DECAY_BIAS = None
# Learning rate of biases is BASE_LR * BIAS_LR_FACTOR.
_C.SOLVER.BIAS_LR_FACTOR = 1.0
# Number of training iterations (optimizer steps).
_C.SOLVER.MAX_ITER = 40000
# LR schedule: "WarmupMultiStepLR" (multiply by GAMMA at each of STEPS), "WarmupCosineLR"
# (half cosine from BASE_LR to the end lr below) or "WarmupStepWithFixedGammaLR" (multiply
# by GAMMA NUM_DECAYS times, at equal intervals).
_C.SOLVER.LR_SCHEDULER_NAME = "WarmupMultiStepLR"
# Iterations at which WarmupMultiStepLR multiplies the LR by GAMMA.
_C.SOLVER.STEPS = (30000,)
# LR multiplier (> 0) of each decay of WarmupMultiStepLR and WarmupStepWithFixedGammaLR.
_C.SOLVER.GAMMA = 0.1
# Number of decays (positive int) of WarmupStepWithFixedGammaLR.
_C.SOLVER.NUM_DECAYS = 3
# End lr of WarmupCosineLR, given one of two ways (the other schedules ignore both):
# BASE_LR_END is detectron2's absolute lr; BASE_LR_END_FACTOR is a fraction of BASE_LR.
# Both default to 0 (decay to 0). Set at most one to a non-zero value: setting both is an
# error. The end lr must lie in [0, BASE_LR]. An absolute BASE_LR_END stays as written when
# auto-scaling changes BASE_LR (as in detectron2); the factor follows the scaled BASE_LR,
# so prefer it with REFERENCE_WORLD_SIZE.
_C.SOLVER.BASE_LR_END = 0.0
_C.SOLVER.BASE_LR_END_FACTOR = 0.0
# Linear or constant warm-up over WARMUP_ITERS iterations starting at BASE_LR * WARMUP_FACTOR.
_C.SOLVER.WARMUP_FACTOR = 0.001
_C.SOLVER.WARMUP_ITERS = 1000
# "linear" or "constant".
_C.SOLVER.WARMUP_METHOD = "linear"
# False: the schedule runs over the whole training and warm-up covers its first part.
# True: the schedule is squeezed into the iterations after warm-up (what it does at
# fraction f of training happens at WARMUP_ITERS + f * (MAX_ITER - WARMUP_ITERS)) and the
# linear warm-up ends at the schedule's start value.
_C.SOLVER.RESCALE_INTERVAL = False
# Save a checkpoint every this many iterations (and at the end); 0 only at the end.
_C.SOLVER.CHECKPOINT_PERIOD = 5000
# Keep only the newest this many periodic checkpoints; 0 keeps all.
_C.SOLVER.MAX_TO_KEEP = 0
# True: a save blocks training only to copy the state to host memory (CPU RAM as large as
# the checkpoint); a background thread writes, fsyncs, renames and tags the file, one save
# after another. A failed write is raised at the next step. False: write before going on.
_C.SOLVER.CHECKPOINT_ASYNC = False
# Number of ranks the config was written for. When the job has another world size,
# DefaultTrainer.auto_scale_workers rescales batch, LR and schedule linearly. 0 disables it.
_C.SOLVER.REFERENCE_WORLD_SIZE = 0
# Gradient clipping: "value" clips each element to [-CLIP_VALUE, CLIP_VALUE]; "norm" clips
# each parameter's gradient norm; "full_model" clips the norm of all gradients together.
_C.SOLVER.CLIP_GRADIENTS = CN({"ENABLED": False})
_C.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "value"
_C.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 1.0
# p of the p-norm used by the "norm" and "full_model" clip types (inf for max-norm).
_C.SOLVER.CLIP_GRADIENTS.NORM_TYPE = 2.0
# Mixed precision: fp16 autocast + GradScaler on CUDA, bfloat16 autocast on CPU.
_C.SOLVER.AMP = CN({"ENABLED": False})
# The autocast dtype with AMP.ENABLED: "" (the device's usual type: float16 on a GPU, bfloat16
# on the CPU), "float16" (with a GradScaler; its skipped steps are [metric]amp_skipped_steps)
# or "bfloat16" (no scaler).
_C.SOLVER.AMP.PRECISION = ""
# Check losses for NaN/inf on their device, read only when metrics are synchronised
# (WRITER_PERIOD) and before every checkpoint, so a step never waits for the GPU; the error
# still names the first bad step, and no checkpoint holds its update. None: True when the
# model is on a GPU, False on the CPU (where reading a loss every step costs nothing);
# True/False force it. See docs/device.md.
_C.SOLVER.DEFERRED_CHECKS = None
# How the optimizer's step is computed: "" (fused where torch has a fused kernel for the
# optimizer and every parameter is on a GPU — it takes the AMP scaler's state on the device
# without a wait — else torch's default), "fused", "foreach" or "for_loop" (one parameter at
# a time).
_C.SOLVER.OPTIMIZER_IMPL = ""
# Micro-batches per optimizer step (gradient accumulation), >= 1. An iteration is one
# optimizer step: MAX_ITER, the LR schedule, checkpoint and eval periods count steps.
# IMS_PER_BATCH stays the images of one step summed over all ranks, so each rank maps
# IMS_PER_BATCH / (world size * ACCUMULATE_STEPS) images per micro-batch.
_C.SOLVER.ACCUMULATE_STEPS = 1
# How auto-scaling (REFERENCE_WORLD_SIZE > 0) adapts the config to another world size W:
# "linear" (detectron2's rule): IMS_PER_BATCH and BASE_LR scale with W, MAX_ITER, STEPS,
# WARMUP_ITERS and the periods inversely — another recipe, and a resume on another world size
# is refused. "accumulate": IMS_PER_BATCH, BASE_LR and the schedule are kept and
# ACCUMULATE_STEPS becomes ACCUMULATE_STEPS * REFERENCE_WORLD_SIZE / W when that is whole,
# else 1 when W is larger and divides IMS_PER_BATCH (smaller micro-batches); otherwise the
# config is refused (a micro-batch would grow). Runs and resumes on any such W are the same run.
_C.SOLVER.SCALE_MODE = "linear"

# ---- Exponential moving average of the weights (the MODEL_EMA hook) ---------------------
_C.MODEL_EMA = CN()
# Keep an EMA of the model's parameters and buffers, updated after every optimizer step
# and saved in checkpoints.
_C.MODEL_EMA.ENABLED = False
# Weight of the old average at each update, in [0, 1): ema = DECAY * ema + (1 - DECAY) * w.
_C.MODEL_EMA.DECAY = 0.999
# Evaluate (during training and with --eval-only) with the EMA weights instead of the
# trained ones.
_C.MODEL_EMA.USE_FOR_EVAL = False

# ---- Test / evaluation ------------------------------------------------------------------
_C.TEST = CN()
# Evaluate every this many iterations (and after the last); 0 only after training.
_C.TEST.EVAL_PERIOD = 0
# Images per rank in a test batch.
_C.TEST.IMS_PER_BATCH = 1
# Expected results, as [[task, metric, value, tolerance], ...], checked after evaluation.
_C.TEST.EXPECTED_RESULTS = []
# PreciseBN: recompute BatchNorm statistics over NUM_ITER batches before evaluation.
_C.TEST.PRECISE_BN = CN({"ENABLED": False})
_C.TEST.PRECISE_BN.NUM_ITER = 200
# At every evaluation (TEST.EVAL_PERIOD and after training) also compute the model's
# training losses on each DATASETS.TEST set: the training-mode forward without gradients,
# BatchNorm on its running statistics and dropout off, averaged per record over the whole
# set (every record once, across all ranks). Written as validation/<loss> (with several
# test sets validation/<dataset>/<loss>) to every writer; the time it took is logged. The
# test loader's mapper must keep what the loss needs (e.g. the labels).
_C.TEST.VAL_LOSS = False
# Early stopping: end training gracefully (final checkpoint, writers flushed, exit status 0)
# once an evaluation metric has stopped improving. --resume of a stopped run does not train.
_C.TEST.EARLY_STOP = CN()
# The flattened evaluation result to watch, e.g. "classification/top1" or
# "validation/total_loss" (with TEST.VAL_LOSS); "" turns early stopping off. Needs
# TEST.EVAL_PERIOD > 0.
_C.TEST.EARLY_STOP.METRIC = ""
# "max" if larger values are better (accuracy), "min" if smaller are (a loss).
_C.TEST.EARLY_STOP.MODE = "max"
# Stop after this many evaluations in a row without improvement (>= 1).
_C.TEST.EARLY_STOP.PATIENCE = 5
# A value counts as an improvement only if it beats the best by more than this (>= 0, in
# the metric's units).
_C.TEST.EARLY_STOP.MIN_DELTA = 0.0

# ---- Misc -------------------------------------------------------------------------------
# Directory for checkpoints, logs, metrics and the resolved config.
_C.OUTPUT_DIR = "./output"
# Global seed; < 0 draws a random seed (logged) that is shared by all ranks.
_C.SEED = -1
# torch.backends.cudnn.benchmark: faster convolutions for fixed input sizes.
_C.CUDNN_BENCHMARK = False
# The writers run every this many iterations (and after the last one).
_C.WRITER_PERIOD = 20
# Where metrics go (rank 0 only), any of: "console" (a log line with the ETA), "json"
# (OUTPUT_DIR/metrics.json), "tensorboard" (event files in OUTPUT_DIR), "wandb" (Weights &
# Biases, see WANDB; pip install 'trainkit[wandb]'), "mlflow" (an MLflow tracking server, see
# MLFLOW; pip install 'trainkit[mlflow]'). A tracker that is not installed or not reachable
# stops the run before training; one that fails during training is logged once and turned
# off. A tracker's run id is kept in OUTPUT_DIR (wandb_run_id, mlflow_run_id), so a resumed
# run continues the same tracker run.
_C.WRITERS = ("console", "json", "tensorboard")

# Weights & Biases (WRITERS includes "wandb"). Entity, API key and server come from W&B's own
# settings (`wandb login`, WANDB_ENTITY, WANDB_API_KEY, WANDB_BASE_URL).
_C.WANDB = CN()
# The W&B project the run is logged to.
_C.WANDB.PROJECT = "trainkit"
# "online": log to the W&B server (checked, with the login, before training); "offline":
# only files in OUTPUT_DIR/wandb (or $WANDB_DIR/wandb when the WANDB_DIR environment
# variable is set), uploaded later with `wandb sync`; needs no network.
_C.WANDB.MODE = "online"

# MLflow (WRITERS includes "mlflow").
_C.MLFLOW = CN()
# Tracking server or store, e.g. "http://127.0.0.1:5000" (checked to accept connections
# before training); "" uses MLflow's default: the MLFLOW_TRACKING_URI environment
# variable, else a local store in the working directory.
_C.MLFLOW.TRACKING_URI = ""
# Name of the MLflow experiment the run goes to; created if missing.
_C.MLFLOW.EXPERIMENT = "trainkit"
# Seconds a rank may go without finishing a phase (data, step, checkpoint, eval) before the
# watchdog stops the job; 0 disables the watchdog.
_C.WATCHDOG_TIMEOUT_S = 0.0
# Slow ranks named (docs/runs_and_metrics.md, "Slow ranks"): at every WRITER_PERIOD the ranks
# compare their own work per step (every phase but waiting in collectives); a rank at least
# 1 + MARGIN times the median of the other ranks' for PERIODS periods in a row is named in the
# log and in the metrics (straggler/*).
_C.STRAGGLER = CN()
# Compare the ranks (True) or not (False); with one process there is nothing to compare.
_C.STRAGGLER.ENABLED = True
# How much slower than the others' median a rank must be: 0.5 is 50 %; in (0, 0.5].
_C.STRAGGLER.MARGIN = 0.5
# Writer periods in a row a rank must be that slow to be named; 1, 2 or 3.
_C.STRAGGLER.PERIODS = 3

# Debugging aids; each costs time, so all are off by default.
_C.DEBUG = CN()
# With CUDA: record the allocator's history of allocations during training
# (torch.cuda.memory._record_memory_history), so that a device out-of-memory error saves the
# allocator's snapshot in OUTPUT_DIR/failed_steps/iter_<N>/ (open it at
# https://pytorch.org/memory_viz). Slows every allocation; ignored without CUDA.
_C.DEBUG.CUDA_MEMORY_HISTORY = False
# Placeholder for user-defined keys: anything may be added under it.
_C.GLOBAL = CN(new_allowed=True)
_C.GLOBAL.HACK = 1.0

# detectron2's keys that trainkit's schema above lacks, with detectron2's defaults.
add_detectron2_keys(_C)


def get_cfg() -> CN:
    """Return a fresh copy of trainkit's default config (the schema above)."""
    return _C.clone()

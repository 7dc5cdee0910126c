"""Benchmarks of trainkit, each measured beside the plain-PyTorch code it replaces.

Run ``python tools/benchmark.py --task TASK [TASK ...] [--json OUT] [--quick | --write-docs]``
(or ``python -m benchmarks ...`` from the repository root). One module per task:

* ``sampler``, ``data_memory``, ``metafile``: data at scale (memory, first batch, reads);
* ``data`` (with ``padding``): train loader throughput and padding;
* ``train``, ``eval``: the training step and inference against hand-written loops;
* ``launch``, ``checkpoint``: start-up and failures; save, load and async saves;
* ``goodput`` (with ``goodput_job``): the main job under SIGKILLs, restarted by itself;
* ``fsdp``: a ViT's training state per process sharded with FSDP2 against DDP, and the
  dry run's memory figures against the measured ones.

``runner`` holds the task registry and the command line; ``measure`` the memory and timing
helpers; ``report`` the tables, targets and verdicts; ``shapes`` the built-in dataset and
model as the benchmarks use them. Benchmarks use trainkit's public names; the few private
uses say why where they occur.
"""

"""Test isolation: a process group a test started in the pytest process ends with it."""

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    # shard_model starts a one-process group when there is none (FSDP needs one); a test that
    # shards in this process must not leave later tests running "distributed".
    started_here = not (dist.is_available() and dist.is_initialized())
    yield
    if started_here and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

"""The CUDA-only private names of torch (trainkit.utils.torch_private) on a GPU."""

import pytest
import torch

from trainkit.utils import torch_private

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_allocator_history_is_recorded_and_dumped(tmp_path):
    torch_private.record_cuda_memory_history(True, max_entries=1000)
    try:
        torch.ones(1024, device="cuda")
        path = tmp_path / "snapshot.pickle"
        torch_private.dump_cuda_memory_snapshot(str(path))
        assert path.stat().st_size > 0
    finally:
        torch_private.record_cuda_memory_history(False)


def test_a_host_device_wait_warns_with_the_text_trainkit_counts():
    x = torch.ones(1, device="cuda")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning, match=torch_private.CUDA_SYNC_WARNING):
            x.item()
    finally:
        torch.cuda.set_sync_debug_mode(0)

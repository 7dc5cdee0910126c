"""ImageList: padding, sizes, indexing, divisibility and padding constraints."""

import pytest
import torch

from trainkit.structures import ImageList


def test_pads_to_the_largest_size_and_keeps_each_image():
    a = torch.full((3, 4, 5), 1.0)
    b = torch.full((3, 6, 2), 2.0)
    images = ImageList.from_tensors([a, b], pad_value=-1.0)
    assert images.tensor.shape == (2, 3, 6, 5)
    assert images.image_sizes == [(4, 5), (6, 2)]
    assert len(images) == 2
    assert torch.equal(images[0], a) and torch.equal(images[1], b)
    assert (images.tensor[0, :, 4:, :] == -1).all() and (images.tensor[1, :, :, 2:] == -1).all()


def test_size_divisibility_rounds_height_and_width_up():
    images = ImageList.from_tensors([torch.ones(1, 33, 30), torch.ones(1, 10, 64)], 32)
    assert images.tensor.shape == (2, 1, 64, 64)
    single = ImageList.from_tensors([torch.ones(3, 33, 30)], size_divisibility=16, pad_value=7)
    assert single.tensor.shape == (1, 3, 48, 32)
    assert single.tensor[0, :, 33:, :].eq(7).all() and torch.equal(single[0], torch.ones(3, 33, 30))


def test_padding_constraints_square_size_and_divisibility():
    images = ImageList.from_tensors([torch.ones(2, 5)], padding_constraints={"square_size": 8})
    assert images.tensor.shape == (1, 8, 8)
    images = ImageList.from_tensors(
        [torch.ones(5, 5)], size_divisibility=32, padding_constraints={"size_divisibility": 4}
    )
    assert images.tensor.shape == (1, 8, 8)


def test_to_and_device():
    images = ImageList.from_tensors([torch.ones(2, 2, dtype=torch.uint8)]).to(torch.float32)
    assert images.tensor.dtype == torch.float32 and images.device.type == "cpu"
    assert images.image_sizes == [(2, 2)]


@pytest.mark.parametrize(
    "tensors", [[], (torch.ones(3, 4, 4), torch.ones(1, 4, 4)), [torch.ones(2, 2), "image"]]
)
def test_bad_input_is_a_value_error(tensors):
    with pytest.raises(ValueError, match="ImageList.from_tensors"):
        ImageList.from_tensors(tensors)

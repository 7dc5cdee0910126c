"""Image sizes from file headers: the size an upright-turning reader would return."""

import pytest
from PIL import Image, ImageFile, ImageOps

from trainkit.data.plans.grouping import image_size_from_header


def _jpeg(path, size, orientation=None):
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.new("RGB", size, (200, 10, 10)).save(path, exif=exif.tobytes())
    return str(path)


def _decoded_upright_size(path):
    with Image.open(path) as image:
        return ImageOps.exif_transpose(image).size


@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
def test_jpeg_size_follows_exif_orientation_like_a_decoded_image(tmp_path, orientation):
    path = _jpeg(tmp_path / "a.jpg", (48, 16), orientation)
    expected = (16, 48) if orientation in (5, 6, 7, 8) else (48, 16)
    assert image_size_from_header(path) == expected == _decoded_upright_size(path)


def test_png_size_is_read_without_decoding_the_pixels(tmp_path, monkeypatch):
    path = tmp_path / "a.png"
    Image.new("L", (30, 70)).save(path)

    decoded, original = [], ImageFile.ImageFile.load

    def load(image):
        decoded.append(image)
        return original(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    assert image_size_from_header(str(path)) == (30, 70)
    assert decoded == []
    with Image.open(path) as image:  # the counter works: Pillow decodes a PNG to find EXIF
        image.getexif()
    assert len(decoded) == 1


def test_a_missing_or_non_image_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        image_size_from_header(str(tmp_path / "missing.png"))
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(OSError):
        image_size_from_header(str(text))

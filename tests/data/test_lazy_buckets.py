"""Aspect-ratio grouping of records without width/height: image headers, read lazily."""

import itertools

import pytest
from PIL import Image

from trainkit.config import ConfigError, get_cfg
from trainkit.data import TrainingSampler, build_batch_data_loader, build_train_loader
from trainkit.data.plans.grouping import BucketOf, LazyBucketIds, record_bucket_ids

BINS = [0.5, 1.0, 2.0]
SIZES = [(20, 60), (40, 30), (90, 30), (30, 30), (50, 40), (30, 40), (100, 20)]
N = 28  # records


def _bucket(width, height):
    return sum(width / height >= b for b in BINS)


@pytest.fixture
def images(tmp_path):
    """N records without width/height, over PNGs of several aspect ratios (and their sizes)."""
    records, sizes = [], []
    for i in range(N):
        size = SIZES[i % len(SIZES)]
        path = tmp_path / f"{i}.png"
        Image.new("L", size).save(path)
        records.append({"id": i, "file_name": str(path)})
        sizes.append(size)
    return records, sizes


@pytest.fixture
def header_reads(monkeypatch):
    """Count the images PIL opens."""
    opened = []
    original = Image.open

    def counting_open(fp, *args, **kwargs):
        opened.append(getattr(fp, "name", fp))
        return original(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    return opened


def id_of(record):
    return record["id"]


def _loader(records, *, rank=0, world_size=1, num_workers=0, batch=4):
    sampler = TrainingSampler(len(records), seed=7, rank=rank, world_size=world_size)
    return build_batch_data_loader(
        records,
        sampler,
        batch,
        mapper=id_of,
        aspect_ratio_grouping=True,
        aspect_ratio_bins=BINS,
        num_workers=num_workers,
    )


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_no_header_is_read_when_the_loader_is_built(images, header_reads):
    records, sizes = images
    loader = _loader(records)
    assert header_reads == []
    _take(loader, 2)
    # Only the positions the plan reached so far, each once.
    assert 0 < len(header_reads) <= loader.state_dict()["position"]
    assert len(set(header_reads)) == len(header_reads)
    _take(loader, 30)  # several epochs: every header read exactly once
    assert sorted(header_reads) == sorted(r["file_name"] for r in records)
    assert len({_bucket(*size) for size in sizes}) == 4


def test_batches_hold_one_bucket_and_equal_those_of_records_with_sizes(images):
    records, sizes = images
    batches = _take(_loader(records), 20)
    for batch in batches:
        assert len({_bucket(*sizes[i]) for i in batch}) == 1, batch
    assert len({_bucket(*sizes[b[0]]) for b in batches}) > 2
    sized = [{**r, "width": w, "height": h} for r, (w, h) in zip(records, sizes)]
    assert _take(_loader(sized), 20) == batches


def test_world_size_two_deals_the_same_global_batches(images):
    records, _ = images
    reference = _take(_loader(records), 15)
    ranks = [_take(_loader(records, rank=r, world_size=2), 15) for r in range(2)]
    # Rank r gets elements r, r + 2 of each step's batch.
    assert [[x for pair in zip(a, b) for x in pair] for a, b in zip(*ranks)] == reference


def test_num_workers_do_not_change_the_batches(images):
    records, _ = images
    assert _take(_loader(records, num_workers=2), 12) == _take(_loader(records), 12)


def test_a_resumed_loader_continues_with_the_same_batches(images, header_reads):
    records, _ = images
    reference = _take(_loader(records), 16)
    loader = _loader(records)
    assert _take(loader, 6) == reference[:6]
    state = loader.state_dict()
    assert any(state["buckets"]), "expected records waiting in buckets"
    header_reads.clear()
    resumed = _loader(records)
    resumed.load_state_dict(state)
    assert header_reads == []
    assert _take(resumed, 10) == reference[6:]


def test_config_form_groups_records_without_sizes(images):
    records, sizes = images
    cfg = get_cfg()
    cfg.SEED, cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_WORKERS = 3, 4, 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.DATALOADER.ASPECT_RATIO_BINS = BINS
    for batch in _take(build_train_loader(cfg, id_of, dataset=records), 10):
        assert len({_bucket(*sizes[i]) for i in batch}) == 1


def test_records_with_and_without_sizes_mix(images, header_reads):
    records, sizes = images
    mixed = [
        {**r, "width": w, "height": h} if i % 2 == 0 else r
        for i, (r, (w, h)) in enumerate(zip(records, sizes))
    ]
    ids = record_bucket_ids(mixed, BINS)
    assert isinstance(ids, LazyBucketIds) and header_reads == []
    assert [ids[i] for i in range(N)] == [_bucket(*s) for s in sizes]
    assert len(header_reads) == N // 2  # only the records without sizes


def test_a_record_without_size_or_file_name_fails_when_built_or_reached(images):
    records, _ = images
    with pytest.raises(ConfigError, match=r"record 0 has no 'width'/'height' and no 'file_name'"):
        _loader([{"id": 0}, *records])
    sized = [{"id": i, "width": 2, "height": 1} for i in range(3)] + [{}]
    ids = record_bucket_ids(sized, BINS)  # only the first record is read now
    with pytest.raises(ConfigError, match=r"record 3 .*ASPECT_RATIO_GROUPING False"):
        ids[3]


def test_an_unreadable_image_fails_when_reached_in_one_line(images, tmp_path):
    records, _ = images
    broken = tmp_path / "broken.png"
    broken.write_text("not an image")
    records = [*records[:5], {"id": 5, "file_name": str(broken)}, *records[6:]]
    with pytest.raises(ConfigError) as raised:
        _take(_loader(records), 30)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"record 5 ({broken}) has no 'width'/'height'")
    assert "DATALOADER.ASPECT_RATIO_GROUPING False" in message


def test_bucket_of_a_streamed_record_reads_its_header(images):
    records, sizes = images
    bucket_of = BucketOf(BINS)
    assert [bucket_of(r) for r in records[:7]] == [_bucket(*s) for s in sizes[:7]]

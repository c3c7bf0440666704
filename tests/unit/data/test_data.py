"""Dataset converters (real MNIST/Fashion-MNIST files, a written CIFAR-10 pickle, an image folder),
the on-disk format, and the loader's epoch/rank guarantees."""
from __future__ import annotations

import gzip
import hashlib
import pickle

import numpy as np
import pytest
import torch
from conftest import cli_in_process

from genlab.core.errors import GenlabError
from genlab.data import convert
from genlab.data.formats import read_image_dataset, write_image_dataset
from genlab.data.loader import ImageLoader, IndexStream


def test_mnist_converter_on_real_files(shared_data, tmp_path):
    out = convert.prepare("mnist", src=shared_data / "mnist", out=tmp_path / "mnist", split="test")
    d = read_image_dataset(out)
    assert d.images.shape == (10000, 28, 28, 1) and d.images.dtype == np.uint8
    # reference: parse the idx file independently (header is 16 bytes for images, 8 for labels)
    raw = gzip.decompress((shared_data / "mnist" / "t10k-images-idx3-ubyte.gz").read_bytes())
    ref = np.frombuffer(raw[16:], dtype=np.uint8).reshape(10000, 28, 28)
    lab = np.frombuffer(gzip.decompress((shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes())[8:], np.uint8)
    np.testing.assert_array_equal(d.images[..., 0], ref)
    np.testing.assert_array_equal(d.labels, lab.astype(np.int64))
    assert np.bincount(d.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # known MNIST test counts


def test_fashion_converter_on_real_files(shared_data, tmp_path):
    out = convert.prepare("fashion-mnist", src=shared_data / "fashion-mnist", out=tmp_path / "f", split="test")
    d = read_image_dataset(out)
    assert d.images.shape == (10000, 28, 28, 1)
    assert np.bincount(d.labels).tolist() == [1000] * 10
    assert d.classes[9] == "Ankle boot"


def test_idx_checksum_mismatch_creates_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    imgs = np.zeros((3, 28, 28), np.uint8)
    header = bytes([0, 0, 8, 3]) + np.array([3, 28, 28], ">i4").tobytes()
    (src / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + imgs.tobytes()))
    (src / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + np.array([3], ">i4").tobytes() + bytes(3)))
    with pytest.raises(GenlabError, match="checksum mismatch"):
        convert.prepare("mnist", src=src, out=tmp_path / "out", split="test")
    assert not (tmp_path / "out").exists()
    # the same files convert when the user opts out of verification
    d = read_image_dataset(convert.prepare("mnist", src=src, out=tmp_path / "out", split="test", verify=False))
    assert d.images.shape == (3, 28, 28, 1)


def _write_cifar(folder, n_per_batch=4):
    """Files in the official CIFAR-10 python format (dict with bytes keys, rows R|G|B planes)."""
    rng = np.random.default_rng(0)
    base = folder / "cifar-10-batches-py"
    base.mkdir(parents=True)
    expected_imgs, expected_labels = [], []
    for i in range(1, 6):
        hwc = rng.integers(0, 256, (n_per_batch, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, n_per_batch).tolist()
        rows = hwc.transpose(0, 3, 1, 2).reshape(n_per_batch, 3072)  # the published layout
        with open(base / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"batch_label": b"x", b"labels": labels, b"data": rows, b"filenames": []}, f)
        expected_imgs.append(hwc)
        expected_labels += labels
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in names], b"num_vis": 3072}, f)
    return np.concatenate(expected_imgs), np.array(expected_labels), names


def test_cifar10_converter_on_written_pickle(tmp_path):
    imgs, labels, names = _write_cifar(tmp_path / "src")
    # our files are not the official ones: the checksum check must refuse them and write nothing
    with pytest.raises(GenlabError, match="checksum mismatch"):
        convert.prepare("cifar10", src=tmp_path / "src", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    d = read_image_dataset(convert.prepare("cifar10", src=tmp_path / "src", out=tmp_path / "out", verify=False))
    np.testing.assert_array_equal(d.images, imgs)
    np.testing.assert_array_equal(d.labels, labels)
    assert d.classes == names
    # a pixel check of the plane layout: red of pixel (0, 1) is byte 1 of the row
    row = imgs[0].transpose(2, 0, 1).reshape(-1)
    assert d.images[0, 0, 1, 0] == row[1] and d.images[0, 0, 1, 2] == row[2048 + 1]


def test_imagefolder_converter(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(1)
    for c in ("cat", "dog"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / "src" / c / f"{i}.png")
    with pytest.raises(GenlabError, match="not square"):
        convert.prepare("imagefolder", src=tmp_path / "src", out=tmp_path / "a")
    d = read_image_dataset(convert.prepare("imagefolder", src=tmp_path / "src", out=tmp_path / "b", size=16, channels=1))
    assert d.images.shape == (6, 16, 16, 1) and d.classes == ["cat", "dog"]
    assert d.labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_prepare_refuses_existing_output_and_unknown_kind(tmp_path, capfd):  # the CLI in-process
    out = convert.prepare("digits", out=tmp_path / "d")
    before = hashlib.sha256((out / "images.npy").read_bytes()).hexdigest()
    r = cli_in_process(capfd, "data", "prepare", "digits", "--out", str(out))
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert hashlib.sha256((out / "images.npy").read_bytes()).hexdigest() == before
    r = cli_in_process(capfd, "data", "prepare", "svhn", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "valid: digits, mnist, fashion-mnist, cifar10, imagefolder" in r.stderr
    assert not (tmp_path / "x").exists()


def test_corrupt_dataset_is_refused(tmp_path):
    out = write_image_dataset(tmp_path / "d", np.zeros((4, 8, 8, 1), np.uint8), np.arange(4), ["a"] * 4, source="t")
    images = np.load(out / "images.npy")
    images[0, 0, 0, 0] = 7
    np.save(out / "images.npy", images)
    with pytest.raises(GenlabError, match="checksum mismatch"):
        read_image_dataset(out)
    (out / "labels.npy").write_bytes(b"garbage")
    with pytest.raises(GenlabError, match="corrupt"):
        read_image_dataset(out)
    with pytest.raises(GenlabError, match="no dataset"):
        read_image_dataset(tmp_path / "nothing")


def test_index_stream_every_sample_once_per_epoch_and_reshuffled():
    s = IndexStream(10, seed=3)
    e0, e1 = s.take(10), s.take(10)
    assert sorted(e0.tolist()) == list(range(10)) and sorted(e1.tolist()) == list(range(10))
    assert e0.tolist() != e1.tolist()
    # batches that straddle an epoch boundary still give every sample once per epoch
    s2 = IndexStream(10, seed=3)
    chunks = np.concatenate([s2.take(3) for _ in range(10)])[:20]
    np.testing.assert_array_equal(chunks, np.concatenate([e0, e1]))


def test_loader_rank_sharding_no_duplicates_or_gaps():
    from genlab.data.datasets import load_digits_uint8
    data = load_digits_uint8()
    n, world, bs = len(data), 3, 7
    seen = []
    loaders = [ImageLoader(data, bs, "cpu", seed=5, rank=r, world=world, on_device="no", prefetch=2) for r in range(world)]
    steps = n // (bs * world)
    per_rank = [[] for _ in range(world)]
    for r, ld in enumerate(loaders):
        for _ in range(steps):
            per_rank[r].append(ld.take_rank_slice())
    for step in range(steps):
        for r in range(world):
            seen.extend(per_rank[r][step].tolist())
    assert len(seen) == len(set(seen)) == steps * bs * world  # no duplicates within the epoch
    # the union over ranks is exactly the single-process stream of the global batch
    ref = IndexStream(n, 5).take(steps * bs * world)
    np.testing.assert_array_equal(np.array(seen), ref)


def test_loader_batches_are_normalised_and_resumable():
    from genlab.data.datasets import load_digits_uint8
    data = load_digits_uint8()
    a = ImageLoader(data, 16, "cpu", seed=1, on_device="no", prefetch=3)
    first = [a.next() for _ in range(5)]
    state = a.state_dict()
    rest = [a.next()["image"] for _ in range(3)]
    b = ImageLoader(data, 16, "cpu", seed=1, on_device="yes")
    b.load_state_dict(state)
    for x, y in zip(rest, [b.next()["image"] for _ in range(3)]):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    x = first[0]["image"]
    assert x.shape == (16, 1, 8, 8) and x.min() >= -1 and x.max() <= 1
    ref = torch.from_numpy(data.images[a.stream.__class__(len(data), 1).take(16)]).permute(0, 3, 1, 2).double() / 127.5 - 1
    torch.testing.assert_close(x.double(), ref)
    a.close()


def test_embedded_digits_equal_sklearns_loader_and_skip_importing_sklearn():
    """The digits are read from the csv inside scikit-learn; they must be exactly what sklearn's loader returns,
    and reading them must not import scikit-learn (~2-3 s of every run's start-up)."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    code = ("import sys; from genlab.data.datasets import load_digits_uint8; d = load_digits_uint8(); "
            "print('sklearn' in sys.modules, d.meta['sha256'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert r.returncode == 0, r.stderr
    imported, checksum = r.stdout.split()
    assert imported == "False"
    from sklearn.datasets import load_digits

    from genlab.data.datasets import load_digits_uint8
    from genlab.data.formats import array_checksum
    ref = load_digits()
    images = np.round(ref.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[..., None]
    data = load_digits_uint8()
    np.testing.assert_array_equal(data.images, images)
    np.testing.assert_array_equal(data.labels, ref.target)
    assert checksum == data.meta["sha256"] == array_checksum(images, ref.target.astype(np.int64))

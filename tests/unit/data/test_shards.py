"""Large image sets: ADM's centre-crop rule, `genlab data prepare shards` (class folder, CSV/JSON list), the shard
format, and the streaming loader's order, resume and rank slices."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import cli_in_process, straight_and_resumed, write_shard_dataset
from PIL import Image

from genlab.core.errors import GenlabError
from genlab.data import build_loader
from genlab.data.convert import prepare
from genlab.data.convert import center_crop_arr
from genlab.data.shards import ShardData, read_shards
from genlab.runtime.metrics import read_metrics


class LoaderCfg:
    on_device, prefetch, pin_memory, hflip = "auto", 2, "auto", False


def rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def save_png(path, a):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)
    return path


# -- ADM's crop rule -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("h,w,size", [(64, 96, 8), (96, 64, 8), (128, 128, 16), (64, 192, 16)])
def test_center_crop_halves_by_box_means_then_crops_the_centre(h, w, size):
    """Sizes where every step is an exact halving: the result is the mean of each (h/size_h)^2 block of the original
    (PIL rounds to uint8 after each of the log2 halvings: error <= 1 per step), cropped at the centre."""
    a = rgb(h, w).astype(np.float64)
    f = min(h, w) // size
    blocks = a.reshape(h // f, f, w // f, f, 3).mean(axis=(1, 3))
    top, left = (blocks.shape[0] - size) // 2, (blocks.shape[1] - size) // 2
    ref = blocks[top:top + size, left:left + size]
    out = center_crop_arr(Image.fromarray(rgb(h, w)), size)
    assert out.shape == (size, size, 3) and out.dtype == np.uint8
    assert np.abs(out - ref).max() <= np.log2(f) + 1e-9


@pytest.mark.parametrize("h,w,size", [(20, 30, 16), (30, 20, 16), (31, 17, 8), (100, 37, 16), (16, 16, 16)])
def test_center_crop_resizes_the_short_side_then_crops_the_centre(h, w, size):
    """Sizes below two halvings: one bicubic resize of the short side to `size`, long side scaled and rounded,
    then the central crop; a constant image stays constant; size x size input is unchanged."""
    im = Image.fromarray(rgb(h, w, seed=h * w))
    s = min(h, w)
    while s >= 2 * size:  # the naive reference: how many halvings, then one resize from there
        im, s = im.resize((im.size[0] // 2, im.size[1] // 2), Image.BOX), s // 2
    nw, nh = round(im.size[0] * size / s), round(im.size[1] * size / s)
    big = np.asarray(im.resize((nw, nh), Image.BICUBIC))
    ref = big[(nh - size) // 2:(nh - size) // 2 + size, (nw - size) // 2:(nw - size) // 2 + size]
    out = center_crop_arr(Image.fromarray(rgb(h, w, seed=h * w)), size)
    np.testing.assert_array_equal(out, ref)
    assert min(nw, nh) == size
    flat = center_crop_arr(Image.fromarray(np.full((h, w, 3), 77, np.uint8)), size)
    assert flat.shape == (size, size, 3) and (flat == 77).all()
    if h == w == size:
        np.testing.assert_array_equal(out, rgb(h, w, seed=h * w))


# -- conversion --------------------------------------------------------------------------------------------------
def class_folder(root, per_class=(3, 4)):
    files = []
    for ci, (c, n) in enumerate(zip(("cat", "dog"), per_class)):
        for i in range(n):
            files.append((save_png(root / c / f"{i}.png", rgb(20 + 3 * i, 24 + 5 * ci, seed=10 * ci + i)), ci))
    return files


def test_class_folder_converts_to_shards_in_parallel(tmp_path):
    files = class_folder(tmp_path / "src")
    one = read_shards(prepare("shards", src=tmp_path / "src", out=tmp_path / "a", size=16, shard_size=3, workers=1))
    two = read_shards(prepare("shards", src=tmp_path / "src", out=tmp_path / "b", size=16, shard_size=3, workers=2))
    assert one.classes == ["cat", "dog"] and one.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert [s["count"] for s in one.meta["shards"]] == [3, 3, 1] and one.images.shape == (7, 16, 16, 3)
    expect = np.stack([center_crop_arr(Image.open(f).convert("RGB"), 16) for f, _ in files])
    np.testing.assert_array_equal(one.images[:], expect)
    np.testing.assert_array_equal(two.images[:], expect)
    assert not list(tmp_path.glob(".a.tmp-*"))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_file_list_converts_with_its_labels(tmp_path, fmt):
    a = [save_png(tmp_path / "img" / f"{i}.png", rgb(18, 18 + i, seed=i)) for i in range(5)]
    names = ["zebra", "ant", "zebra", "bee", "ant"]
    rows = [{"path": f"img/{p.name}", "label": n} for p, n in zip(a, names)]
    lst = tmp_path / f"list.{fmt}"
    if fmt == "csv":
        lst.write_text("path,label\n" + "".join(f"{r['path']},{r['label']}\n" for r in rows))
    else:
        lst.write_text(json.dumps(rows))
    d = read_shards(prepare("shards", src=lst, out=tmp_path / "out", size=8, channels=1, shard_size=2, workers=1))
    assert d.classes == ["ant", "bee", "zebra"] and d.labels.tolist() == [2, 0, 2, 1, 0]
    assert d.images.shape == (5, 8, 8, 1) and len(d.meta["shards"]) == 3
    np.testing.assert_array_equal(d.images[3, ..., 0], center_crop_arr(Image.open(a[3]).convert("L"), 8))


def test_integer_labels_are_class_ids(tmp_path):
    for i in range(3):
        save_png(tmp_path / f"{i}.png", rgb(8, 8, seed=i))
    (tmp_path / "l.csv").write_text("label,path\n4,0.png\n0,1.png\n4,2.png\n")
    d = read_shards(prepare("shards", src=tmp_path / "l.csv", out=tmp_path / "o", size=8, workers=1))
    assert d.labels.tolist() == [4, 0, 4] and d.classes == [str(i) for i in range(5)]


def bad_inputs(tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    save_png(tmp_path / "imgs" / "ok.png", rgb(8, 8))
    (tmp_path / "missing.csv").write_text("path,label\nimgs/ok.png,a\nimgs/gone.png,b\n")
    save_png(tmp_path / "broken" / "a" / "ok.png", rgb(8, 8))
    (tmp_path / "broken" / "b").mkdir()
    (tmp_path / "broken" / "b" / "bad.png").write_bytes(b"not a png at all")
    (tmp_path / "nolabel.csv").write_text("path\nimgs/ok.png\n")
    whole = save_png(tmp_path / "cut" / "a" / "t.png", rgb(64, 64)).read_bytes()
    (tmp_path / "cut" / "a" / "t.png").write_bytes(whole[:len(whole) // 2])  # a PNG cut off half way
    return [("empty", "no images found"), ("missing.csv", "missing, first: .*gone.png"),
            ("broken", "cannot read image .*bad.png"), ("nolabel.csv", "needs both 'path' and 'label'"),
            ("cut", "cannot read image .*t.png")]


def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, capfd):
    for src, msg in bad_inputs(tmp_path):
        out = tmp_path / f"out_{src}"
        r = cli_in_process(capfd, "data", "prepare", "shards", "--src", tmp_path / src, "--out", out, "--size", "8",
                           "--shard-size", "1", "--workers", "2")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (src, r.stderr)
        assert re.search(msg, r.stderr), (src, r.stderr)
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))
    r = cli_in_process(capfd, "data", "prepare", "shards", "--src", tmp_path / "imgs", "--out", tmp_path / "o")
    assert r.returncode == 2 and "needs --size" in r.stderr


def test_a_corrupt_shard_is_refused(tmp_path):
    out = write_shard_dataset(tmp_path / "d", np.zeros((5, 4, 4, 1), np.uint8), np.arange(5), ["x"], 2, source="t")
    a = np.load(out / "images-00001.npy")
    a[0, 0, 0, 0] = 1
    np.save(out / "images-00001.npy", a)
    with pytest.raises(GenlabError, match="checksum mismatch in images-00001.npy"):
        read_shards(out)


# -- the streaming loader -------------------------------------------------------------------------------------------
@pytest.fixture
def numbered(tmp_path):
    """23 samples over shards of 5; sample i has every pixel = i and label i, so a batch names its samples."""
    n = 23
    images = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None, None], (n, 4, 4, 1)).copy()
    return read_shards(write_shard_dataset(tmp_path / "num", images, np.arange(n), [str(i) for i in range(n)], 5, "t"))


def ids(batch):
    pix = torch.round((batch["image"][:, 0, 0, 0] + 1) * 127.5).long()
    assert torch.equal(pix, batch["label"])  # the image gathered from the shards is the labelled one
    return batch["label"].tolist()


def stream(loader, steps):
    return [i for _ in range(steps) for i in ids(loader.next())]


def test_the_shard_loader_streams_and_never_makes_the_set_resident(numbered):
    loader = build_loader(numbered, LoaderCfg, 4, "cpu", seed=0)
    assert isinstance(numbered, ShardData) and not loader.resident
    loader.close()


def test_every_sample_exactly_once_per_epoch(numbered):
    loader = build_loader(numbered, LoaderCfg, 4, "cpu", seed=3)
    got = stream(loader, 23)  # 92 samples = 4 epochs of 23, batches straddling the epoch ends
    loader.close()
    epochs = [sorted(got[e * 23:(e + 1) * 23]) for e in range(4)]
    assert all(e == list(range(23)) for e in epochs)
    assert got[:23] != got[23:46]  # a new permutation each epoch


def test_same_order_after_resume_mid_epoch(numbered):
    straight = build_loader(numbered, LoaderCfg, 4, "cpu", seed=1)
    expect = stream(straight, 12)
    straight.close()
    first = build_loader(numbered, LoaderCfg, 4, "cpu", seed=1)
    head = stream(first, 7)  # batches are prefetched ahead: the state must not count them
    state = first.state_dict()
    first.close()
    assert state == {"pos": 28}
    again = build_loader(numbered, LoaderCfg, 4, "cpu", seed=1)
    again.load_state_dict(state)
    assert head + stream(again, 5) == expect
    again.close()


@pytest.mark.parametrize("world", [2, 3])
def test_rank_slices_are_disjoint_and_cover_the_epoch(numbered, world):
    steps, batch = 6, 2
    per_rank = []
    for rank in range(world):
        loader = build_loader(numbered, LoaderCfg, batch, "cpu", seed=5, rank=rank, world=world)
        per_rank.append([ids(loader.next()) for _ in range(steps)])
        loader.close()
    one = build_loader(numbered, LoaderCfg, batch * world, "cpu", seed=5)
    single = stream(one, steps)
    one.close()
    # step by step, the ranks' slices laid side by side are the one-rank stream: disjoint, and each epoch is covered
    joined = [i for s in range(steps) for r in range(world) for i in per_rank[r][s]]
    assert joined == single
    assert sorted(joined[:23]) == list(range(23))


def test_training_on_shards_resumes_exactly(tmp_path, one_thread):
    from genlab.data.datasets import load_digits_uint8
    d = load_digits_uint8()
    write_shard_dataset(tmp_path / "digits", d.images, d.labels, d.classes, 500, "digits")
    common = ["data.name=shards", f"data.path={tmp_path / 'digits'}", "train.steps=12", "log.every=1",
              "log.ckpt_every=0", "eval.num_samples=0"]
    _, a, b = straight_and_resumed(tmp_path, 5, *common)
    assert a["loader"] == b["loader"] == {"pos": 12 * 16}
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    rows = [r for r in read_metrics(tmp_path / "full") if "loss" in r]
    assert len(rows) == 12 and all(0 <= r["data_wait_frac"] <= 1 for r in rows)


def test_sharded_array_indexes_like_the_array_it_splits(tmp_path):
    a = np.random.default_rng(0).integers(0, 256, (11, 3, 2, 1), dtype=np.uint8)
    d = read_shards(write_shard_dataset(tmp_path / "d", a, np.zeros(11), ["x"], 4, "t"))
    idx = np.array([10, 0, 3, 4, 3, -1, 7])
    for key in (idx, slice(2, 9), slice(None, None, -3), 5, -2, np.arange(11) % 2 == 0, (idx, 1), (4, 0, 1, 0)):
        np.testing.assert_array_equal(d.images[key], a[key])
    np.testing.assert_array_equal(np.asarray(d.images), a)
    with pytest.raises(IndexError):
        d.images[[11]]


def test_the_cli_prepares_shards_and_a_run_refuses_to_make_them_resident(tmp_path, capfd):
    class_folder(tmp_path / "src")
    r = cli_in_process(capfd, "data", "prepare", "shards", "--src", tmp_path / "src", "--out", tmp_path / "s",
                       "--size", "8", "--shard-size", "4")
    assert r.returncode == 0 and "wrote" in r.stdout
    assert read_shards(tmp_path / "s").images.shape == (7, 8, 8, 3)
    from genlab.config.check import check_config
    from genlab.config.tree import load_config
    with pytest.raises(GenlabError, match="never resident"):
        check_config(load_config("digits_flow", ["data.name=shards", f"data.path={tmp_path / 's'}", "data.on_device=yes"]))


def test_two_writers_of_one_folder_never_share_a_temporary_folder(tmp_path):
    """Each writer gets its own hidden temporary folder: the one that finishes first keeps `out`, the other fails
    without touching it and leaves nothing behind."""
    from genlab.data.formats import atomic_folder
    out = tmp_path / "d"
    with pytest.raises(OSError):
        with atomic_folder(out) as first:
            (first / "meta.json").write_text('{"writer": 1}')
            with atomic_folder(out) as second:
                assert second != first and first.exists()
                (second / "meta.json").write_text('{"writer": 2}')
    assert json.loads((out / "meta.json").read_text()) == {"writer": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]

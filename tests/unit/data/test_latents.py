"""Latent space: `genlab data encode` (exact against the codec, flipped variants, resume, torchrun slices, refusals),
the latent dataset and its loader (flip choice resumes exactly), and image methods on latents (decoded samples of the
source's pixel shape, evaluation in pixel space against the source, FLOPs of the denoiser only). The codec is
unshuffle:2, an exact inverse, so every comparison is exact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, cli_in_process, patch_everywhere, straight_and_resumed, tiny_config

from genlab.core.errors import GenlabError
from genlab.data.datasets import load_digits_uint8
from genlab.data import encode
from genlab.data.encode import encode_dataset, rank_chunks
from genlab.data.formats import read_image_dataset, write_image_dataset
from genlab.data.encode import LatentLoader, VariantStream, read_latents
from genlab.data.loader import IndexStream
from genlab.data.pixels import to_model
from genlab.nn.autoencoders import load_autoencoder


class LoaderCfg:
    on_device, prefetch, pin_memory, hflip = "auto", 2, "auto", False


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """scikit-learn's digits as a prepared image folder (8x8x1 -> unshuffle:2 latents 4x4x4)."""
    d = load_digits_uint8()
    return write_image_dataset(tmp_path_factory.mktemp("src") / "digits", d.images, d.labels, d.classes, "digits")


@pytest.fixture(scope="module")
def encoded(digits, tmp_path_factory):
    return encode_dataset(digits, "unshuffle:2", tmp_path_factory.mktemp("lat") / "lat", batch_size=256, device="cpu")


def latent_overrides(path, *more):
    return ["data.name=latents", f"data.path={path}", *more]


# -- encoding ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_encode_is_the_codec_and_the_second_variant_is_the_flipped_image(digits, tmp_path, dtype):
    out = encode_dataset(digits, "unshuffle:2", tmp_path / "lat", batch_size=500, device="cpu", dtype=dtype)
    lat = read_latents(out)
    src = read_image_dataset(digits)
    codec = load_autoencoder("unshuffle:2")
    x = to_model(torch.from_numpy(np.array(src.images)))
    assert lat.latents.shape == (1797, 2, 4, 4, 4) and str(lat.latents.dtype) == dtype
    np.testing.assert_array_equal(lat.latents[:, 0], codec.encode(x).numpy().astype(dtype))
    np.testing.assert_array_equal(lat.latents[:, 1], codec.encode(x.flip(-1)).numpy().astype(dtype))
    np.testing.assert_array_equal(lat.labels, src.labels)
    m = lat.meta
    assert m["codec"]["spec"] == "unshuffle:2" and m["source"]["sha256"] == src.meta["sha256"]
    assert (m["num_samples"], m["variants"], m["dtype"], m["pixel_shape"]) == (1797, 2, dtype, [8, 8, 1])
    f = np.asarray(lat.latents, dtype=np.float64)
    assert m["latent_mean"] == pytest.approx(f.mean(), rel=1e-9)
    assert m["latent_std"] == pytest.approx(f.std(), rel=1e-9)
    np.testing.assert_allclose(m["channel_std"], f.std(axis=(0, 1, 3, 4)), rtol=1e-9)
    assert m["encode"]["images"] == 1797 and m["encode"]["images_per_s"] > 0


def test_a_shard_source_encodes_like_the_same_images_as_one_array(digits, encoded, tmp_path):
    from conftest import write_shard_dataset

    from genlab.data.shards import read_shards
    src = read_image_dataset(digits)
    shards = write_shard_dataset(tmp_path / "s", np.array(src.images), src.labels, src.classes, 500, "digits")
    out = encode_dataset(shards, "unshuffle:2", tmp_path / "lat", batch_size=256, device="cpu")
    np.testing.assert_array_equal(np.load(out / "latents.npy"), np.load(encoded / "latents.npy"))
    assert json.loads((out / "meta.json").read_text())["source"]["sha256"] == read_shards(shards).meta["sha256"]


class Crash(Exception):
    pass


def encode_interrupted(after: int, *args, **kw):
    """encode_dataset stopped as by a crash once `after` more chunks are on disk (their done flags flushed)."""
    real, flushes = encode.flush_rows, []

    def flush(mm, s, e):
        real(mm, s, e)
        flushes.append(1)
        if len(flushes) == 2 * after:  # flush_rows runs for a chunk's latents, then for its done flag
            raise Crash
    with pytest.MonkeyPatch.context() as mp, pytest.raises(Crash):
        mp.setattr(encode, "flush_rows", flush)
        encode_dataset(*args, **kw)


def test_an_interrupted_encode_resumes_to_the_same_bytes(digits, encoded, tmp_path):
    out, partial = tmp_path / "lat", tmp_path / "lat.partial"
    encode_interrupted(3, digits, "unshuffle:2", out, batch_size=256, device="cpu")
    assert partial.is_dir() and not out.exists()
    assert np.load(partial / "done.npy").tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(GenlabError, match="unfinished encoding is in its .partial folder"):
        read_latents(out)
    with pytest.raises(GenlabError, match=r"other settings \(dtype\)"):
        encode_dataset(digits, "unshuffle:2", out, batch_size=256, device="cpu", dtype="float32")
    encode_interrupted(2, digits, "unshuffle:2", out, batch_size=256, device="cpu")  # chunks 3, 4
    assert np.load(partial / "done.npy").tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    encode_dataset(digits, "unshuffle:2", out, batch_size=256, device="cpu")
    assert (out / "latents.npy").read_bytes() == (encoded / "latents.npy").read_bytes()
    assert not partial.exists() and sorted(p.name for p in out.iterdir()) == ["labels.npy", "latents.npy", "meta.json"]
    a, b = (json.loads((p / "meta.json").read_text()) for p in (out, encoded))
    assert a["encode"]["images"] == 1797 - 5 * 256  # the cost of the call that finished it
    a.pop("encode"), b.pop("encode")
    assert a == b


def test_a_finished_folder_is_not_overwritten(digits, encoded, tmp_path, capfd):
    out = tmp_path / "lat"
    shutil.copytree(encoded, out)
    before = (out / "latents.npy").stat().st_mtime_ns
    r = cli_in_process(capfd, "data", "encode", digits, "--vae", "unshuffle:2", "--out", out, "--device", "cpu")
    assert r.returncode == 2 and "already holds encoded latents" in r.stderr and "--force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (out / "latents.npy").stat().st_mtime_ns == before
    r = cli_in_process(capfd, "data", "encode", digits, "--vae", "unshuffle:2", "--out", out, "--device", "cpu",
                       "--force", "--no-flip", "--batch-size", "1000")
    assert r.returncode == 0 and "img/s" in r.stderr, r.stderr
    assert read_latents(out).latents.shape == (1797, 1, 4, 4, 4)


@pytest.mark.parametrize("args,match", [(["--vae", "nope:1"], "unknown autoencoder 'nope'"),
                                        (["--vae", "unshuffle:3"], "downsamples by 3"),
                                        (["--vae", "unshuffle:2", "--batch-size", "0"], "batch-size"),
                                        (["--vae", "unshuffle:2", "--precision", "float8_rowwise"], "fp32, tf32, bf16, fp16")])
def test_bad_encode_arguments_are_one_line_errors_that_write_nothing(digits, tmp_path, capfd, args, match):
    r = cli_in_process(capfd, "data", "encode", digits, "--out", tmp_path / "lat", "--device", "cpu", *args)
    assert r.returncode == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "lat").exists()


def test_force_never_replaces_a_folder_that_is_not_latents(digits, capfd):
    before = (digits / "images.npy").stat().st_mtime_ns
    r = cli_in_process(capfd, "data", "encode", digits, "--vae", "unshuffle:2", "--out", digits, "--force")
    assert r.returncode == 2 and "not encoded latents" in r.stderr
    assert (digits / "images.npy").stat().st_mtime_ns == before


def test_a_missing_source_folder_is_a_one_line_error(tmp_path, capfd):
    r = cli_in_process(capfd, "data", "encode", tmp_path / "none", "--vae", "unshuffle:2", "--out", tmp_path / "lat")
    assert r.returncode == 2 and "no prepared image dataset" in r.stderr


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_rank_chunks_are_disjoint_contiguous_and_cover_what_is_left(world):
    todo = [0, 1, 2, 5, 6, 7, 8, 11, 12]
    parts = [rank_chunks(todo, r, world) for r in range(world)]
    assert [c for p in parts for c in p] == todo  # in order, each once
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.slow  # a multi-rank run
def test_two_torchrun_ranks_finish_a_one_process_partial_to_the_same_bytes(digits, encoded, tmp_path):
    """torchrun --nproc_per_node=2 (gloo, CPU) resumes an encoding a single process began: each rank takes a
    disjoint block of the chunks left, and the result is byte for byte the single-process one."""
    out = tmp_path / "lat"
    encode_interrupted(2, digits, "unshuffle:2", out, batch_size=256, device="cpu")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "genlab",
           "data", "encode", str(digits), "--vae", "unshuffle:2", "--out", str(out), "--batch-size", "256",
           "--device", "cpu"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("wrote") == 1 and "on 2 x cpu" in r.stderr
    assert (out / "latents.npy").read_bytes() == (encoded / "latents.npy").read_bytes()
    assert json.loads((out / "meta.json").read_text())["encode"]["images"] == 1797 - 2 * 256


# -- the dataset and its loader --------------------------------------------------------------------------------------
def test_the_variant_stream_keeps_the_image_order_and_picks_variants_from_its_position():
    plain, flips, order = VariantStream(50, 3, stride=2, choices=1), VariantStream(50, 3, stride=2, choices=2), IndexStream(50, 3)
    a, b, idx = plain.take(120), flips.take(120), order.take(120)
    np.testing.assert_array_equal(a, 2 * idx)  # the same sample order as the pixel loader's, plain variant
    np.testing.assert_array_equal(b // 2, idx)
    assert 40 < (b % 2).sum() < 80  # about half flipped (120 fair coins: outside this range with p < 1e-3)
    again = VariantStream(50, 3, stride=2, choices=2)
    again.pos = 37
    np.testing.assert_array_equal(again.take(83), b[37:])


@pytest.mark.parametrize("on_device", ["yes", "no"])
def test_the_loader_flip_choice_resumes_exactly(encoded, on_device):
    data = read_latents(encoded)
    flat = torch.from_numpy(np.array(data.latents, dtype=np.float32).reshape(-1, 4, 4, 4))

    def loader():
        return LatentLoader(data, 8, "cpu", seed=5, rank=1, world=2, on_device=on_device, hflip=True)
    a = loader()
    first = [a.next() for _ in range(3)]
    state = a.state_dict()
    rest = [a.next() for _ in range(4)]
    b = loader()
    b.load_state_dict(state)
    for x, y in zip(rest, [b.next() for _ in range(4)]):
        assert torch.equal(x["image"], y["image"]) and torch.equal(x["label"], y["label"])
    # each draw is one stored variant of a sample, with that sample's label
    k = VariantStream(len(data), 5, stride=2, choices=2).take(16 * 3).reshape(3, 2, 8)[:, 1]
    for got, kk in zip(first, k):
        assert torch.equal(got["image"], flat[kk]) and got["label"].tolist() == np.asarray(data.labels)[kk // 2].tolist()


def test_hflip_on_latents_without_flipped_variants_is_refused_before_training(digits, tmp_path):
    from genlab.config.check import check_config
    from genlab.config.tree import load_config
    out = encode_dataset(digits, "unshuffle:2", tmp_path / "lat", batch_size=1000, flip=False, device="cpu")
    with pytest.raises(GenlabError, match="no flipped variants"):
        check_config(load_config("digits_flow", latent_overrides(out, "data.hflip=true")))


def test_methods_that_need_pixels_refuse_latents(encoded):
    from genlab.config.tree import load_config
    with pytest.raises(GenlabError, match="provides latent data"):
        load_config("digits_flow", latent_overrides(encoded, "method.name=image_ar", "model.name=sparse_transformer"))


# -- training, sampling and evaluation on latents ------------------------------------------------------------------
@pytest.fixture(scope="module")
def latent_run(encoded, tmp_path_factory):
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("runs")
    t = Trainer(tiny_config(out, *latent_overrides(encoded, "data.hflip=true"), "train.name=lat", "train.steps=6",
                            "log.every=3", "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0"))
    t.fit()
    return t, out / "lat"


def test_a_flow_run_on_latents_records_the_codec_and_samples_decoded_images(latent_run, tmp_path, capfd):
    from PIL import Image

    from genlab.runs.load import load_run
    trainer, run = latent_run
    cfg, model, method, dev, state = load_run(run, "cpu")
    assert state["data_spec"]["codec"]["spec"] == "unshuffle:2" and state["data_spec"]["pixel_shape"] == [8, 8, 1]
    assert (state["data_spec"]["image_size"], state["data_spec"]["channels"]) == (4, 4)  # the model sees latents
    labels = torch.arange(6) % 10
    decoded = method.draw(model, 6, labels=labels, generator=torch.Generator().manual_seed(1), device=dev)
    latents = method.sample(model, labels, generator=torch.Generator().manual_seed(1), device=dev)
    assert decoded.shape == (6, 1, 8, 8) and latents.shape == (6, 4, 4, 4)
    torch.testing.assert_close(decoded, F.pixel_shuffle(latents, 2).clamp(-1, 1), rtol=0, atol=0)
    r = cli_in_process(capfd, "sample", run, "--n", "20", "--out", tmp_path / "grid.png", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    # 2 rows x 10 columns of 8x8 tiles with a 1-pixel gap, upscaled 64 // 8 = 8 times (save_grid)
    assert Image.open(tmp_path / "grid.png").size == ((10 * 9 + 1) * 8, (2 * 9 + 1) * 8)


def test_evaluation_scores_decoded_pixels_against_the_source_images(latent_run, digits, monkeypatch):
    import genlab.eval.metrics as metrics
    from genlab.runs.load import evaluate_run
    seen = {}

    def spy(samples, labels, data, ctx):
        seen.update(samples=samples, data=data)
        return {}
    patch_everywhere(monkeypatch, metrics, "image_metrics", spy)
    evaluate_run(latent_run[1], ["eval.num_samples=20"], device="cpu")
    assert seen["samples"].dtype == torch.uint8 and seen["samples"].shape == (20, 8, 8, 1)  # pixels, channels-last
    assert seen["data"].images.shape == (1797, 8, 8, 1)
    assert seen["data"].meta["sha256"] == read_image_dataset(digits).meta["sha256"]


def test_evaluation_without_the_source_is_a_one_line_error_before_sampling(latent_run, digits, tmp_path):
    from genlab.runs.load import evaluate_run
    moved = tmp_path / "away"
    shutil.move(digits, moved)
    try:
        with pytest.raises(GenlabError, match="cannot be read") as e:
            evaluate_run(latent_run[1], ["eval.num_samples=20"], device="cpu")
        assert "\n" not in str(e.value)
    finally:
        shutil.move(moved, digits)


def test_training_on_latents_with_flips_resumes_exactly(encoded, tmp_path, one_thread):
    _, a, b = straight_and_resumed(tmp_path, 3, *latent_overrides(encoded, "data.hflip=true"), "train.steps=6",
                                   "log.every=1", "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0")
    assert a["loader"] == b["loader"] == {"pos": 6 * 16}
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_the_denoiser_flops_are_those_of_the_same_model_on_pixels_of_the_latent_shape(encoded, latent_run):
    """img/s and MFU count the denoiser only: the latent run's FLOPs per sample are a pixel run's at 4x4x4 (the encoder
    ran once, before training; its cost is meta.json's)."""
    from genlab.training.step import build_model_and_method
    cfg = tiny_config(encoded.parent, "data.name=synthetic", "data.image_size=4", "data.channels=4", "data.num_classes=10")
    from genlab.data.datasets import synthetic_spec
    model, method = build_model_and_method(cfg, synthetic_spec(cfg.data))
    assert latent_run[0].flops_per_sample == method.train_flops_per_sample(model, cfg.train.steps) > 0


def test_maskdit_trains_on_latents(encoded, tmp_path):
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, *latent_overrides(encoded), "train.name=m", "train.steps=2", "log.every=1",
                            "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0", "method.unmask_steps=0", "model.patch_size=1",
                            "train.compile=off", "model.decoder_dim=32", "model.decoder_depth=1",
                            preset="mnist_maskdit")).fit()
    assert s["status"] == "finished"


def test_the_latent_preset_loads(encoded):
    from genlab.config.tree import load_config
    cfg = load_config("mnist_latent_flow", [f"data.path={encoded}", "model.patch_size=2"])
    assert cfg.data.name == "latents"

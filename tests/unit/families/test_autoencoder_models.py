"""Autoencoders for latent diffusion beyond the lossless reference: diffusers' AutoencoderKL loaded from a folder
(`diffusers:PATH`, a tiny random-weight model through the same code path as a real SD VAE), the in-project
autoencoder (model autoencoder_kl, method autoencoder) trained on the digits, and that run as a codec (`run:RUN`)."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import cli_in_process

from genlab.core.errors import GenlabError
from genlab.nn.autoencoders import load_autoencoder

# the in-project autoencoder on the digits: base width 32, one ResNet block per level, 8x8x1 -> 4x4x2 (factor 2)
AE = ["data.name=digits", "data.path=", "model.size=tiny", "model.channel_mult=1,2", "model.latent_channels=2",
      "train.batch_size=64", "optim.lr=2e-3", "optim.warmup_steps=10", "log.progress=false", "log.tensorboard=false",
      "eval.num_samples=400", "log.ckpt_every=0", "log.sample_every=0", "train.device=cpu"]
DIGITS = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10}


def one_line(e) -> bool:
    return "\n" not in str(e.value)


# -- diffusers:PATH ----------------------------------------------------------------------------------------------
def tiny_vae(shift):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                                   up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                                   layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16,
                                   scaling_factor=0.37, shift_factor=shift).eval()


@pytest.mark.parametrize("shift", [None, 0.1])
def test_diffusers_codec_is_the_diffusers_model_with_its_scale_and_shift(tmp_path, shift):
    """encode = (posterior mean - shift_factor) * scaling_factor and decode its inverse, against the model itself
    (the saved and reloaded weights are the same numbers: float32 tolerance)."""
    vae = tiny_vae(shift)
    vae.save_pretrained(tmp_path / "vae")
    codec = load_autoencoder(f"diffusers:{tmp_path / 'vae'}")
    assert (codec.scale, codec.shift, codec.factor, codec.latent_shape(3, 16, 16)) == (0.37, shift or 0.0, 2, (4, 8, 8))
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        want = (vae.encode(x).latent_dist.mean - (shift or 0.0)) * 0.37
        z = codec.encode(x)
        torch.testing.assert_close(z, want)
        torch.testing.assert_close(codec.decode(z), vae.decode(want / 0.37 + (shift or 0.0)).sample.clamp(-1, 1))
    assert codec.describe()["spec"] == f"diffusers:{tmp_path / 'vae'}"


def test_pickled_weights_are_refused_without_being_loaded(tmp_path):
    d = tmp_path / "vae"
    d.mkdir()
    (d / "config.json").write_text("{}")
    torch.save({"w": torch.zeros(1)}, d / "diffusion_pytorch_model.bin")
    with pytest.raises(GenlabError, match="refused diffusion_pytorch_model.bin") as e:
        load_autoencoder(f"diffusers:{d}")
    assert one_line(e)


def test_a_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(GenlabError, match="no such folder") as e:
        load_autoencoder(f"diffusers:{tmp_path / 'nope'}")
    assert one_line(e)


def test_without_diffusers_the_error_names_the_extra(tmp_path, monkeypatch):
    d = tmp_path / "vae"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    monkeypatch.setitem(__import__("sys").modules, "diffusers", None)  # import diffusers -> ImportError
    with pytest.raises(GenlabError, match=r'pip install "genlab\[vae\]"') as e:
        load_autoencoder(f"diffusers:{d}")
    assert one_line(e)


# -- the in-project autoencoder ------------------------------------------------------------------------------------
def test_kl_term_is_the_closed_form_for_a_diagonal_gaussian():
    """KL(N(m, s^2) || N(0, 1)) = log(1/s) + (s^2 + m^2)/2 - 1/2 per element, summed per sample (float64)."""
    from genlab.families.autoencoder.method import kl_to_standard_normal
    m = torch.tensor([[[0.5, -1.0], [0.0, 2.0]], [[0.0, 0.0], [0.3, -0.7]]], dtype=torch.float64).unsqueeze(1)
    s = torch.tensor([[[1.0, 0.5], [2.0, 0.1]], [[1.0, 1.0], [0.8, 1.5]]], dtype=torch.float64).unsqueeze(1)
    by_hand = [sum(math.log(1 / sv) + (sv * sv + mv * mv) / 2 - 0.5 for mv, sv in zip(mb.flatten().tolist(), sb.flatten().tolist()))
               for mb, sb in zip(m, s)]
    got = kl_to_standard_normal(m, (s * s).log())
    assert got.dtype == torch.float64 and got.shape == (2,)
    torch.testing.assert_close(got, torch.tensor(by_hand, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert got[1] > 0 and kl_to_standard_normal(torch.zeros(1, 3), torch.zeros(1, 3)).item() == 0.0


def test_flops_are_the_flop_counters_on_the_model_itself():
    from torch.utils.flop_counter import FlopCounterMode

    from genlab.config.tree import load_config
    from genlab.training.step import build_model_and_method
    model, _ = build_model_and_method(load_config("mnist_autoencoder", AE), DIGITS)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(torch.zeros(1, 1, 8, 8))
    assert model.flops_per_sample() == fc.get_total_flops() > 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """100 steps of batch 64 on the digits (CPU, ~11 s): the run folder and its summary."""
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("ae")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = Trainer(load_config("mnist_autoencoder", AE + [f"train.out_dir={out}", "train.name=ae",
                                                                  "train.steps=100"])).fit()
    finally:
        torch.set_num_threads(n)
    return out / "ae", summary


def untrained_l1(seed: int) -> float:
    from genlab.config.tree import load_config
    from genlab.data.datasets import load_digits_uint8
    from genlab.families.autoencoder.method import held_out_images, reconstruct, reconstruction_metrics
    from genlab.training.step import build_model_and_method
    cfg = load_config("mnist_autoencoder", AE)
    torch.manual_seed(seed)
    model, _ = build_model_and_method(cfg, DIGITS)
    x, rec, _ = reconstruct(model.eval(), held_out_images(cfg, load_digits_uint8(), 400)[0], 256, "cpu")
    return reconstruction_metrics(x, rec)["rec_l1"]


@pytest.mark.slow  # the shared `trained` fixture trains an autoencoder for ~11 s
def test_the_trained_autoencoder_reconstructs_the_digits(trained):
    """Encode (posterior mean) -> decode of 400 digits (the evaluation's fixed half; the digits have no test split,
    so the run trained on them too). Measured: L1 0.140 on [-1, 1], PSNR 18.8 dB, after 100 steps (0.117, 20.2 dB after 150); untrained models
    score L1 0.72-0.85 (PSNR 6.5-7.9 dB). Bounds: L1 < 0.2 and < 0.3x the untrained model's."""
    run, s = trained
    assert s["status"] == "finished"
    assert s["rec_l1"] < 0.2 and s["psnr"] > 16, s
    assert s["rec_l1"] < 0.3 * untrained_l1(seed=0)
    stats = json.loads((run / "latent_stats.json").read_text())
    assert stats["images"] == 400 and stats["latent_std"] == s["latent_std"] > 0


@pytest.mark.slow  # the shared `trained` fixture trains an autoencoder for ~11 s
def test_the_preview_shows_originals_above_their_reconstructions(trained):
    from PIL import Image

    from genlab.data.datasets import load_digits_uint8
    from genlab.eval.real_split import real_split
    run, _ = trained
    grid = np.asarray(Image.open(run / "samples.png"))
    up = 64 // 8
    assert grid.shape[:2] == ((4 * 9 + 1) * up, (8 * 9 + 1) * up)  # 16 images: 2 x (8 originals, 8 reconstructions)
    first = real_split(load_digits_uint8(), "", 0, 16).held_out[0, :, :, 0]  # the preview's 16 held-out images
    assert np.array_equal(grid[up:up + 8 * up:up, up:up + 8 * up:up], first)


@pytest.mark.slow  # the shared `trained` fixture trains an autoencoder for ~11 s
def test_run_codec_decodes_its_encodings_as_the_model_reconstructs(trained):
    """run:RUN: decode(encode(x)) is the model's own forward (mean latent) up to float error, and the held-out
    latents it normalises come out at mean 0, std 1 (scale = 1 / std, shift = mean of the same images)."""
    from genlab.data.datasets import load_digits_uint8
    from genlab.data.pixels import to_model
    from genlab.eval.real_split import real_split
    from genlab.runs.load import load_run
    run, s = trained
    codec = load_autoencoder(f"run:{run}")
    _, model, _, _, _ = load_run(run, device="cpu")
    x = to_model(torch.from_numpy(real_split(load_digits_uint8(), "", 0, 400).held_out))
    z = codec.encode(x)
    assert z.shape == (400, 2, 4, 4) and codec.latent_shape(1, 8, 8) == (2, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(codec.decode(z), model(x).clamp(-1, 1), rtol=0, atol=1e-5)
    assert abs(float(z.double().mean())) < 1e-5 and abs(float(z.double().std()) - 1) < 1e-5
    d = codec.describe()
    assert d["scale"] == 1 / s["latent_std"] and d["shift"] == s["latent_mean"] and d["run_step"] == 100
    assert load_autoencoder(d["spec"]).scale == d["scale"]


@pytest.mark.slow  # the shared `trained` fixture trains an autoencoder for ~11 s
def test_run_codec_needs_the_latent_statistics(trained, tmp_path):
    ckpt = next((trained[0] / "checkpoints").glob("step_*.pt"))
    lone = tmp_path / "elsewhere" / "checkpoints"
    lone.mkdir(parents=True)
    shutil.copy(ckpt, lone / ckpt.name)
    with pytest.raises(GenlabError, match="genlab eval") as e:
        load_autoencoder(f"run:{lone / ckpt.name}")
    assert one_line(e)
    with pytest.raises(GenlabError, match="nope' does not exist; give a run folder"):
        load_autoencoder(f"run:{tmp_path / 'nope'}")


@pytest.mark.slow  # the shared `trained` fixture trains an autoencoder for ~11 s
def test_sample_writes_a_reconstruction_grid(trained, tmp_path):
    from genlab.runs.load import sample_to_file
    out = sample_to_file(trained[0], n=8, out=tmp_path / "g.png", device="cpu")
    assert out.is_file()


def test_the_gan_term_and_its_discriminator_start_at_gan_start(tmp_path, one_thread):
    """method.gan_weight > 0: no discriminator loss before method.gan_start, then a hinge loss for the discriminator's
    own optimizer and a finite positive adaptive weight; the discriminator and its optimizer are checkpointed."""
    from genlab.config.tree import load_config
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    Trainer(load_config("mnist_autoencoder", AE + [f"train.out_dir={tmp_path}", "train.name=g", "train.steps=4",
                                                   "train.batch_size=16", "log.every=1", "method.gan_weight=0.5",
                                                   "method.gan_start=2", "eval.num_samples=0"])).fit()
    rows = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [("d_loss" in r) for r in rows] == [False, False, True, True]
    assert all(0 < r["gan_w"] < 1e4 and math.isfinite(r["d_loss"]) for r in rows[2:])
    state = ckpt.load_checkpoint(tmp_path / "g")
    assert "disc" in state["extras"] and "disc" in state["extra_optimizers"]


@pytest.mark.parametrize("override,needle", [("model.channel_mult=1,2,2,2,2", "not a multiple of 16"),
                                             ("model.channel_mult=1,1.5", "whole numbers"),
                                             ("model.bottleneck=vq", "model.bottleneck")])
def test_bad_autoencoder_settings_fail_in_one_line_before_any_work(tmp_path, capfd, override, needle):
    r = cli_in_process(capfd, "train", "mnist_autoencoder", *AE, f"train.out_dir={tmp_path}", override)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


def test_the_method_refuses_a_model_that_is_not_an_autoencoder(tmp_path, capfd):
    r = cli_in_process(capfd, "train", "digits_flow", "method.name=autoencoder", f"train.out_dir={tmp_path}")
    assert r.returncode == 2 and "model.name=autoencoder_kl" in r.stderr, r.stderr


def test_the_preset_is_sds_objective_at_a_factor_that_divides_mnist():
    from genlab.config.tree import load_config
    from genlab.families.autoencoder.model import channel_mult, check_image_size
    cfg = load_config("mnist_autoencoder")
    assert (cfg.model.name, cfg.method.name, cfg.model.bottleneck, cfg.method.kl_weight) == \
        ("autoencoder_kl", "autoencoder", "kl", 1e-6)
    mult = channel_mult(cfg.model)
    check_image_size(28, mult)  # 28 -> 7: factor 4
    assert 2 ** (len(mult) - 1) == 4 and cfg.method.gan_weight == 0

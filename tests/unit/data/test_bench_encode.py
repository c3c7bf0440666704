"""The encode-speed benchmark (benchmarks/latents.py encode) and `genlab data encode --precision`: reduced-precision
autocast runs the same SD-VAE-layout diffusers model (a narrow one here) and stays within its rounding error of
float32; the benchmark runs genlab's own encode on a CPU at tiny sizes and prints one row per setting."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from conftest import REPO

from genlab.data.encode import encode_dataset
from test_latents import encode_interrupted

pytest.importorskip("diffusers")
sys.path.insert(0, str(REPO / "benchmarks"))
import latents  # noqa: E402


@pytest.fixture(scope="module")
def vae_and_images(tmp_path_factory):
    work = tmp_path_factory.mktemp("enc")
    vae = latents.save_vae(work / "vae", latents.SMALL)
    return f"diffusers:{vae}", latents.write_images(work / "images", 6, 32, None)


def test_bf16_encode_is_the_fp32_encode_within_bf16_rounding(vae_and_images, tmp_path):
    vae, images = vae_and_images
    lat = {}
    for prec in ("fp32", "bf16"):
        out = encode_dataset(images, vae, tmp_path / prec, batch_size=4, device="cpu", precision=prec, dtype="float32")
        meta = json.loads((out / "meta.json").read_text())
        assert meta["precision"] == prec and meta["encode"]["precision"] == prec
        lat[prec] = np.load(out / "latents.npy")
    err = np.abs(lat["bf16"] - lat["fp32"]) / lat["fp32"].std()
    # bf16 keeps 8 significant bits (relative rounding 2^-9 per operation); a dozen convolutions and norms
    # accumulate it to a few 1e-3 on average. Exactly 0 would mean autocast never ran.
    assert 0 < err.mean() < 2e-2 and err.max() < 0.25


def test_the_benchmark_prints_one_row_per_precision_and_flip_setting(tmp_path, capsys):
    torch.manual_seed(0)
    latents.main(["encode", "--device", "cpu", "--n", "4", "--size", "32", "--batch-size", "2", "--small", "--warmup", "1",
                       "--precision", "fp32,bf16", "--json", str(tmp_path / "rows.json")])
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["precision"], r["variants"]) for r in rows] == [("fp32", 2), ("bf16", 2), ("fp32", 1), ("bf16", 1)]
    assert all(r["images"] == 4 and r["images_per_s"] > 0 and r["latent_shape"] == [4, 4, 4] for r in rows)
    assert [r["err_vs_fp32"] == 0 for r in rows] == [True, False, True, False]
    assert capsys.readouterr().out.count("\n| ") == 2 + len(rows)


@pytest.mark.parametrize("opts", [{"channels_last": True}, pytest.param({"compile": True}, marks=pytest.mark.slow)],
                         ids=["channels_last", "compile"])  # compile: 8 s of inductor on a CPU
def test_channels_last_and_compiled_encoders_compute_the_plain_encode(vae_and_images, tmp_path, opts):
    """Same function, other kernels: float32 latents agree to float32 rounding through a dozen convolutions
    (relative ~1e-6 of the latent scale; 1e-4 leaves room for reordered sums), and the setting is recorded so a
    resume with another one is refused."""
    vae, images = vae_and_images
    plain = encode_dataset(images, vae, tmp_path / "plain", batch_size=4, device="cpu", dtype="float32")
    other = encode_dataset(images, vae, tmp_path / "other", batch_size=4, device="cpu", dtype="float32", **opts)
    a, b = np.load(plain / "latents.npy"), np.load(other / "latents.npy")
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    meta = json.loads((other / "meta.json").read_text())
    assert all(meta["encode"][k] is True for k in opts) and all(meta[k] is True for k in opts)
    partial = tmp_path / "part.partial"
    encode_interrupted(1, images, vae, tmp_path / "part", batch_size=4, device="cpu")
    from genlab.core.errors import GenlabError
    with pytest.raises(GenlabError, match="other settings"):
        encode_dataset(images, vae, tmp_path / "part", batch_size=4, device="cpu", **opts)
    assert partial.name == "part.partial"

"""Training an image autoencoder for latent diffusion (model autoencoder_kl): LDM's loss without the perceptual term,
an optional PatchGAN under VQGAN's adaptive weight (docs/latents.md); evaluation writes RUN/latent_stats.json. And
`run:RUN`, the codec of such a run: loaded like every run (EMA weights where kept), scaled by the latent std and shifted
by the mean its evaluation measured.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.core.files import write_atomic
from genlab.data import build_dataset
from genlab.data.pixels import to_model
from genlab.eval.real_split import real_split
from genlab.families.autoencoder import render
from genlab.families.base import Extra, Method, method_registry
from genlab.families.baselines import Baseline, mean_image_l1, training_images
from genlab.families.build import load_run
from genlab.families.models import model_registry
from genlab.nn.autoencoders import LatentCodec, autoencoder_registry
from genlab.runtime.checkpoint import resolve_checkpoint
from genlab.runtime.parallel import unwrap

STATS_FILE = "latent_stats.json"


class AeMethodKeys(cf.Keys, section="method"):
    kl_weight: float = cf.F(1e-6, "autoencoder: weight of KL(q(z|x) || N(0, I)) next to the per-pixel L1 (SD's VAEs: 1e-6; "
                                  "read with model.bottleneck=kl)", ge=0)
    gan_weight: float = cf.F(0.0, "autoencoder: weight of the PatchGAN generator term (0 = no discriminator; LDM: 0.5 with "
                                  "the adaptive weight)", ge=0)
    gan_start: int = cf.F(0, "autoencoder: optimizer steps before the discriminator and its term start", ge=0)
    gan_adaptive: bool = cf.F(True, "autoencoder: VQGAN's adaptive GAN weight (gradient-norm ratio at the decoder's last "
                                    "layer) times method.gan_weight; false = method.gan_weight alone")
    gan_lr: float = cf.F(0.0, "autoencoder: discriminator learning rate (0 = optim.lr)", ge=0)


def kl_to_standard_normal(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, 1)) summed over each sample's elements: 0.5 * sum(mean^2 + var - 1 - logvar)."""
    return 0.5 * (mean.square() + logvar.exp() - 1.0 - logvar).flatten(1).sum(1)


class PatchDiscriminator(nn.Module):
    """pix2pix's N-layer PatchGAN as LDM uses it (4x4 convs, stride 2 then 1, LeakyReLU 0.2): one logit per patch."""

    def __init__(self, channels: int, width: int = 64, layers: int = 3):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        mods, cin = [sn(nn.Conv2d(channels, width, 4, 2, 1)), nn.LeakyReLU(0.2)], width
        for i in range(1, layers + 1):
            cout = width * min(2 ** i, 8)
            mods += [sn(nn.Conv2d(cin, cout, 4, 2 if i < layers else 1, 1)), nn.LeakyReLU(0.2)]
            cin = cout
        mods.append(sn(nn.Conv2d(cin, 1, 4, 1, 1)))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):  # logits in fp32
            return self.net(x.float())


def disc_layers(image_size: int) -> int:
    """Strided layers that leave the 4x4-kernel head a map of at least 2x2 (3 from 64 px up, as pix2pix)."""
    n = 1
    while n < 3 and image_size // 2 ** (n + 1) >= 4:
        n += 1
    return n


def adaptive_weight(rec_loss, gan_loss, last_layer) -> torch.Tensor:
    """VQGAN eq. 7: |grad rec| / (|grad gan| + 1e-4) at the decoder's last layer, clamped to [0, 1e4], detached."""
    g_rec = torch.autograd.grad(rec_loss, last_layer, retain_graph=True)[0]
    g_gan = torch.autograd.grad(gan_loss, last_layer, retain_graph=True)[0]
    return (g_rec.norm() / (g_gan.norm() + 1e-4)).clamp(0.0, 1e4).detach()


@torch.no_grad()
def reconstruct(model, images_u8, batch: int, device):
    """Held-out uint8 [N, H, W, C] -> (originals, posterior-mean reconstructions, latents), float [-1, 1] on the CPU."""
    base = unwrap(model)
    xs, recs, zs = [], [], []
    for i in range(0, len(images_u8), batch):
        x = to_model(torch.as_tensor(np.asarray(images_u8[i:i + batch])).to(device))
        z = base.encode(x)
        xs.append(x.float().cpu())
        zs.append(z.float().cpu())
        recs.append(base.decode(z).float().clamp(-1, 1).cpu())
    return torch.cat(xs), torch.cat(recs), torch.cat(zs)


def reconstruction_metrics(x: torch.Tensor, rec: torch.Tensor) -> dict:
    """L1 on [-1, 1]; PSNR in dB on [0, 1] per image, averaged (MSE floored at 1e-10)."""
    mse = ((x - rec) / 2).square().flatten(1).mean(1).clamp_min(1e-10)
    return {"rec_l1": float((x - rec).abs().mean()), "psnr": float((-10 * torch.log10(mse)).mean())}


def latent_stats(z: torch.Tensor) -> dict:
    """Mean and std of every latent value (SD's scaling_factor = 1 / this std)."""
    z = z.double()
    return {"latent_mean": float(z.mean()), "latent_std": float(z.std())}


def held_out_images(cfg, data, n: int) -> tuple[np.ndarray, str]:
    """n held-out images, as image evaluation picks them (eval/real_split.py: eval.val_path or a fixed half)."""
    split = real_split(data, cfg.eval.val_path, 0, n)
    return split.held_out, split.source


class Autoencoder(Method):
    batch_keys = ("image",)
    best_metric = "rec_l1"
    data_kinds, model_families = ("image",), ("autoencoder",)
    render = render  # originals above reconstructions (autoencoder/render.py)

    def __init__(self, cfg, data_spec):
        keys = AeMethodKeys.of(cfg.method)
        self.cfg, self.mcfg, self.spec = cfg, cfg.method, data_spec
        self.gan = keys.gan_weight > 0
        self._data = None

    def extra_modules(self):
        keys = AeMethodKeys.of(self.mcfg)
        if not self.gan:
            return {}
        disc = PatchDiscriminator(self.spec["channels"], layers=disc_layers(self.spec["image_size"]))
        return {"disc": Extra(disc, trainable=True, optimizer="disc", lr=keys.gan_lr or None)}

    def loss(self, model, batch, ctx):
        keys = AeMethodKeys.of(self.mcfg)
        x = batch["image"]
        base = unwrap(model)
        noise = None
        if base.kl:
            c, h, w = base.latent_shape(*x.shape[1:])
            noise = torch.randn((x.shape[0], c, h, w), generator=ctx.generator, device=x.device, dtype=x.dtype)
        rec, mean, logvar = model(x, noise, return_posterior=True)
        rec_loss = (x.float() - rec.float()).abs().mean()
        loss, metrics = rec_loss, {"rec_l1": rec_loss.detach()}
        if logvar is not None:
            kl = kl_to_standard_normal(mean.float(), logvar.float()).mean() / x[0].numel()
            loss = loss + keys.kl_weight * kl
            metrics["kl"] = kl.detach()
        if not self.gan or ctx.step < keys.gan_start:
            return loss, metrics
        # one discriminator forward for both losses (the trainer back-propagates d_loss into the discriminator only)
        fake, real = ctx.extras["disc"](torch.cat([rec, x])).chunk(2)
        g_loss = -fake.mean()
        d_loss = 0.5 * (F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean())
        w = keys.gan_weight
        if keys.gan_adaptive:
            w = w * adaptive_weight(rec_loss, g_loss, base.decoder.out[-1].weight)  # the output conv's weight
        metrics.update(g_loss=g_loss.detach(), d_loss=d_loss.detach(), gan_w=torch.as_tensor(w).detach())
        return {"model": loss + w * g_loss, "disc": d_loss}, metrics

    def trivial_baselines(self, data, generator):
        # rec_l1, in training and in evaluation: an autoencoder that ignores its input reconstructs the mean image
        return [Baseline("rec_l1", mean_image_l1(training_images(data, generator, self.cfg.data.hflip)),
                         "L1 of reconstructing the per-pixel mean image")]

    def evaluate(self, model, data, ctx) -> dict:
        ecfg = ctx["eval"]
        if ecfg.num_samples <= 0:
            return {}
        images, source = held_out_images(ctx["cfg"], data, ecfg.num_samples)
        x, rec, z = reconstruct(model, images, ecfg.batch_size, ctx["device"])
        res = {**reconstruction_metrics(x, rec), **latent_stats(z)}
        if ctx.get("run_dir") is not None:
            write_atomic(Path(ctx["run_dir"]) / STATS_FILE, json.dumps({**res, "images": len(images), "source": source}, indent=2))
        return res

    def reconstructions(self, model, n, device):
        """n held-out originals and their reconstructions (render.py draws them)."""
        if self._data is None:
            self._data = build_dataset(self.cfg.data)
        x, rec, _ = reconstruct(model, held_out_images(self.cfg, self._data, n)[0], 256, device)
        return x, rec


def read_stats(run_dir) -> dict | None:
    p = Path(run_dir) / STATS_FILE
    try:
        s = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s.get("latent_std"), (int, float)) and math.isfinite(s["latent_std"]) and s["latent_std"] > 0 else None


method_registry.register("autoencoder", "image autoencoder for latent diffusion: L1 + kl_weight * KL (+ optional "
                                        "PatchGAN hinge term), eval = held-out reconstruction L1/PSNR and latent std",
                         keys=AeMethodKeys, reads=("eval.val_path",))(Autoencoder)


def find_stats(arg: str) -> dict:
    p = Path(arg).expanduser()  # the run folder, or a checkpoint or exported file in it or one below
    for d in [p] if p.is_dir() and p.suffix != ".dcp" else [p.parent, p.parent.parent]:
        s = read_stats(d)
        if s is not None:
            return s
    raise GenlabError(f"autoencoder run:{arg}: no {STATS_FILE} with the latent std (its evaluation writes it: "
                      f"`genlab eval {arg}`, with eval.num_samples > 0)")


def check_run(arg: str) -> None:
    try:
        resolve_checkpoint(arg)
    except GenlabError as e:
        raise GenlabError(f"autoencoder run:{arg}: {e}") from None
    find_stats(arg)


class RunCodec(LatentCodec):
    def __init__(self, spec: str, model, channels: int, stats: dict, step: int):
        super().__init__(spec, channels=channels, latent_channels=model.latent_channels, factor=model.factor,
                         scale=1.0 / stats["latent_std"], shift=stats.get("latent_mean", 0.0))
        self.model, self.step, self.stats = model, step, stats

    def encode_raw(self, x):
        return self.model.encode(x)

    def decode_raw(self, z):
        return self.model.decode(z)

    def describe(self) -> dict:
        return {**super().describe(), "run_step": self.step,
                "latent_stats": {k: self.stats.get(k) for k in ("images", "source", "rec_l1", "psnr")}}


@autoencoder_registry.register("run", "an autoencoder genlab trained (method autoencoder): run folder or "
                                      "checkpoint; scale 1/std, shift mean of its latents", arg="RUN", check=check_run)
def build_run(arg, device):
    try:
        cfg, model, _, _, state = load_run(arg, device="cpu")
    except GenlabError as e:
        raise GenlabError(f"autoencoder run:{arg}: {e}") from None
    if model_registry.spec(cfg.model.name).family != "autoencoder":
        raise GenlabError(f"autoencoder run:{arg}: its model {cfg.model.name} is not an autoencoder "
                          f"(train one with method.name=autoencoder, e.g. `genlab train mnist_autoencoder`)")
    return RunCodec(f"run:{Path(arg).resolve()}", model, state["data_spec"]["channels"], find_stats(arg),  # absolute
                    int(state.get("step", 0)))

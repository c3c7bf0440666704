"""Autoregressive image modelling over bytes (the Sparse Transformer's objective): next-byte cross-entropy, bits/dim,
sampling and completion. Batches are float [-1, 1], exactly u8 / 127.5 - 1, so rounding recovers the bytes.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.data import build_dataset
from genlab.data.formats import read_image_dataset
from genlab.data.pixels import to_model, to_pixels
from genlab.families.base import Method, method_registry
from genlab.families.baselines import Baseline, position_byte_entropy, subset_index
from genlab.families.lm.autoregressive import next_token
from genlab.families.models import model_registry
from genlab.families.sparse import render
from genlab.families.sparse.sparse_transformer import START, image_to_seq, seq_to_image, shift_in
from genlab.runtime.parallel import unwrap

LN2 = math.log(2.0)


@torch.no_grad()
def sample_seq(model, n: int, T: int, device, given=None, given_mask=None, temperature: float = 1.0,
               generator=None) -> torch.Tensor:
    """n sequences of T bytes sampled left to right with a key/value cache; given_mask keeps the bytes of `given`."""
    base = unwrap(model)
    out = torch.zeros(n, T, dtype=torch.long, device=device)
    cache, tok = [], torch.full((n, 1), START, dtype=torch.long, device=device)
    for t in range(T):
        nxt = next_token(base.decode(tok, cache).float(), temperature, generator=generator)[:, 0]
        if given_mask is not None:
            nxt = torch.where(given_mask[:, t], given[:, t], nxt)
        out[:, t] = nxt
        tok = nxt[:, None]
    return out


class ImageAR(Method):
    sample_options = ("temperature",)
    render = render  # sampled and completed images, attention pictures (sparse/render.py)
    batch_keys = ("image",)
    best_metric = "val_bits_per_dim"
    data_kinds, model_families, sampling_keys = ("image",), ("sparse_transformer",), ("method.temperature",)

    def __init__(self, cfg, data_spec):
        if data_spec.get("kind") != "image":
            raise GenlabError(f"method image_ar needs image data (data.name=images|digits|synthetic), got {data_spec.get('kind')!r}")
        if model_registry.spec(cfg.model.name).family != "sparse_transformer":
            raise GenlabError(f"method image_ar needs model.name=sparse_transformer, got {cfg.model.name!r}")
        self.cfg, self.mcfg, self.spec = cfg, cfg.method, data_spec
        self.H, self.C = data_spec["image_size"], data_spec["channels"]
        self.order = cfg.model.raster
        self.T = self.H * self.H * self.C

    def seq(self, u8):
        return image_to_seq(u8, self.order)

    def image(self, seq):
        return seq_to_image(seq, self.H, self.H, self.C, self.order)

    def loss(self, model, batch, ctx):
        y = self.seq(to_pixels(batch["image"]).long())  # float [-1, 1] -> the bytes, long [B, H, W, C]
        return model(shift_in(y), targets=y), {}

    def synthetic_batch(self, batch_size, device, generator):
        u8 = torch.randint(0, 256, (batch_size, self.H, self.H, self.C), generator=generator, device=device)
        return {"image": to_model(u8), "label": torch.zeros(batch_size, dtype=torch.long, device=device)}

    def trivial_baselines(self, data, generator):
        # a byte model that knows each byte's position but none of the bytes before it
        h = position_byte_entropy(np.asarray(data.images[subset_index(len(data.images), generator)]))
        what = "per-position byte entropy of the training images"
        return [Baseline("loss", h, what), Baseline("val_bits_per_dim", h / LN2, what)]

    def heldout(self, data, k: int):
        """uint8 [k, H, W, C] held-out images (eval.val_path, else the tail of `data`: None = the run's dataset) and
        where they came from."""
        data = build_dataset(self.cfg.data) if data is None else data
        if self.cfg.eval.val_path:
            val = read_image_dataset(self.cfg.eval.val_path)
            if list(val.images.shape[1:]) != [self.H, self.H, self.C]:
                raise GenlabError(f"eval.val_path images are {list(val.images.shape[1:])}, the model's {[self.H, self.H, self.C]}")
            return np.array(val.images[:k]), "val_path"  # a copy: the memmap is read-only, torch warns on it
        return np.array(data.images[len(data) - min(k, len(data)):]), "train_tail"

    @torch.no_grad()
    def bits_per_dim(self, model, u8: torch.Tensor, batch: int = 64) -> float:
        nll, count = 0.0, 0
        for i in range(0, len(u8), batch):
            y = self.seq(u8[i:i + batch].long())
            logits = model(shift_in(y)).double()  # float64 sums: a uniform model gives 8.000000 exactly
            nll += F.cross_entropy(logits.flatten(0, 1), y.reshape(-1), reduction="sum").item()
            count += y.numel()
        return nll / count / LN2

    @torch.no_grad()
    def evaluate(self, model, data, ctx) -> dict:
        ecfg, device = ctx["eval"], ctx["device"]
        if ecfg.num_samples <= 0:
            return {}
        imgs, source = self.heldout(data, ecfg.num_samples)
        bpd = self.bits_per_dim(model, torch.from_numpy(imgs).to(device), batch=max(1, min(ecfg.batch_size, 64)))
        return {"val_bits_per_dim": bpd, "val_images": len(imgs), "val_source": source}

    def sample_images(self, model, n, generator, device, temperature=None):
        t = self.mcfg.temperature if temperature is None else temperature
        return self.image(sample_seq(model, n, self.T, device, temperature=t, generator=generator))

    def draw(self, model, n, *, steps=None, generator=None, device=None, temperature=None):
        device = device or next(unwrap(model).parameters()).device
        return to_model(self.sample_images(model, n, generator, device, temperature))

    @torch.no_grad()
    def sample(self, model, labels=None, n=None, steps=None, cfg_scale=None, sampler=None, generator=None, device=None):
        """Unconditional whole images in [-1, 1], float [n, C, H, W]; labels only give n."""
        return self.draw(model, len(labels) if labels is not None else n, generator=generator, device=device)

    def complete(self, model, u8: torch.Tensor, k: int, generator, device, temperature=None):
        """Completions of images u8 [m, H, W, C] given their top half: long [m, k, H, W, C]."""
        t = self.mcfg.temperature if temperature is None else temperature
        m = len(u8)
        given_img = torch.zeros(m, self.H, self.H, self.C, dtype=torch.bool, device=device)
        given_img[:, :self.H // 2] = True
        given = self.seq(u8.long().to(device)).repeat_interleave(k, 0)
        mask = self.seq(given_img).repeat_interleave(k, 0)
        out = sample_seq(model, m * k, self.T, device, given, mask, t, generator)
        return self.image(out).view(m, k, self.H, self.H, self.C), given_img


method_registry.register("image_ar", "autoregressive image bytes (Sparse Transformer): bits/dim, sampling, "
                                     "top-half completion, attention pictures",
                         reads=("method.temperature", "eval.val_path"))(ImageAR)

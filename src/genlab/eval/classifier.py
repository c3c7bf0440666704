"""An in-project image classifier trained on the real data: it scores samples (sample accuracy) and
gives the feature space of the Fréchet distance when Inception weights cannot be had offline."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core import progress
from genlab.data.pixels import to_model


class SmallConvNet(nn.Module):
    def __init__(self, channels: int, num_classes: int, feat_dim: int = 128):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.GELU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, feat_dim), nn.GELU(),
        )
        self.head = nn.Linear(feat_dim, num_classes)

    def forward(self, x, return_features=False):
        f = self.features(x)
        return (self.head(f), f) if return_features else self.head(f)


def train_classifier(images_u8: np.ndarray, labels: np.ndarray, num_classes: int, epochs: int = 30,
                     device="cpu", seed: int = 0, batch_size: int = 128):
    """Train on 90% of the data, report accuracy on the held-out 10%. Always in fp32: the trainer's final
    evaluation runs under bf16 autocast, and this small net trained under it stays at chance accuracy."""
    with torch.autocast(torch.device(device).type, enabled=False):
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        n = len(images_u8)
        perm = torch.randperm(n, generator=g).numpy()
        n_val = max(1, n // 10)
        val, tr = perm[:n_val], perm[n_val:]
        # copies: a prepared dataset is a read-only memmap, and torch warns on a tensor over a non-writable array
        x = to_model(torch.from_numpy(np.array(images_u8))).to(device)
        y = torch.from_numpy(np.array(labels, dtype=np.int64)).to(device)
        net = SmallConvNet(x.shape[1], num_classes).to(device)
        # scale the epoch count down for large datasets so the classifier costs about the same
        epochs = max(2, min(epochs, int(epochs * 20000 / max(len(tr), 1))))
        steps = epochs * max(1, len(tr) // batch_size)
        opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
        tr_t = torch.from_numpy(tr).to(device)
        for step in progress.track(range(steps), "eval: training the feature classifier (cached afterwards)", unit="step"):
            idx = tr_t[torch.randint(len(tr), (batch_size,), generator=g).to(device)]
            xb = x[idx]
            shift = torch.randint(-1, 2, (2,), generator=g).tolist()  # small translations regularise
            xb = torch.roll(xb, shifts=shift, dims=(2, 3))
            loss = F.cross_entropy(net(xb), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        net.eval()
        with torch.no_grad():
            val_t = torch.from_numpy(val).to(device)
            acc = (predict(net, x[val_t]).argmax(-1) == y[val_t]).float().mean().item()
        return net, acc


@torch.no_grad()
def predict(net, x, batch=1024, return_features=False):
    outs = [net(x[i:i + batch], return_features=True) for i in range(0, len(x), batch)]
    logits, feats = (torch.cat(t) for t in zip(*outs))
    return (logits, feats) if return_features else logits


def _learned(num_classes: int) -> float:
    """Held-out accuracy below which a classifier is taken not to have learned (twice chance)."""
    return 2.0 / num_classes


def get_classifier(data, device="cpu", epochs: int = 30):
    """Load the cached classifier for this dataset, or train and cache it: one entry per dataset and setting,
    $GENLAB_CACHE/classifiers/<data sha256[:16]>-e<epochs>.pt, so only a dataset's first evaluation trains it."""
    spec = data.spec
    key = (data.meta.get("sha256") or "nokey")[:16]
    path = Path(os.environ.get("GENLAB_CACHE", Path.home() / ".cache" / "genlab")) / "classifiers" / f"{key}-e{epochs}.pt"
    net = SmallConvNet(spec["channels"], spec["num_classes"])
    if data.meta.get("sha256") and path.exists():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            net.load_state_dict(state["model"])
            if float(state["val_acc"]) >= _learned(spec["num_classes"]):
                return net.to(device).eval(), float(state["val_acc"])
        except Exception:
            pass  # a stale or broken cache entry (or one that never learned) is simply retrained
    net, acc = train_classifier(np.asarray(data.images), np.asarray(data.labels), spec["num_classes"],
                                epochs=epochs, device=device)
    if acc < _learned(spec["num_classes"]):
        warnings.warn(f"the feature classifier reached only {acc:.1%} held-out accuracy (chance {1 / spec['num_classes']:.1%}): "
                      "sample accuracy and feature FD of this evaluation mean nothing; it is not cached")
    elif data.meta.get("sha256"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # runs of a packed sweep may write the same entry at once
        torch.save({"model": net.cpu().state_dict(), "val_acc": acc}, tmp)
        os.replace(tmp, path)
    return net.to(device).eval(), acc

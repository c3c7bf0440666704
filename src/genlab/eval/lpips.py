"""LPIPS v0.1 (Zhang et al. 2018) without torchvision or the lpips package: d(x, y) = sum_l mean_hw w_l .
(f̂_l(x) - f̂_l(y))^2, f̂ = f / ||f||_channels, f_l the ReLU outputs of five layers of an ImageNet AlexNet or VGG-16.
Module names (`features.*` as torchvision's, `lin0..lin4` with `model.1.weight` as the lpips package's alex.pth /
vgg.pth) match the published files, so both load strictly."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.data.pixels import to_model
from genlab.eval.inception import find_file, load_state

# conv (out, kernel, stride, padding) | "M" max pool; the index in the Sequential is torchvision's
ALEX = [(64, 11, 4, 2), "M", (192, 5, 1, 2), "M", (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1), "M"]
VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
# index of the ReLU whose output is each LPIPS layer (relu1..relu5 / relu1_2, relu2_2, relu3_3, relu4_3, relu5_3)
TAPS = {"alex": (1, 4, 7, 9, 11), "vgg": (3, 8, 15, 22, 29)}
CHANNELS = {"alex": (64, 192, 384, 256, 256), "vgg": (64, 128, 256, 512, 512)}
BACKBONE_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}  # torchvision's names
BACKBONE_URLS = {n: f"https://download.pytorch.org/models/{f}" for n, f in BACKBONE_FILES.items()}
LIN_URL = "https://github.com/richzhang/PerceptualSimilarity/raw/master/lpips/weights/v0.1/{net}.pth"
MIN_SIZE = 64  # smaller images are upsampled first: AlexNet's stride-4 stem and pools leave nothing of 8x8 or 28x28


def _features(net: str) -> nn.Sequential:
    layers, cin = [], 3
    for spec in ALEX if net == "alex" else [s if s == "M" else (s, 3, 1, 1) for s in VGG16]:
        if spec == "M":
            layers.append(nn.MaxPool2d(3, 2) if net == "alex" else nn.MaxPool2d(2, 2))
        else:
            out, k, s, p = spec
            layers += [nn.Conv2d(cin, out, k, stride=s, padding=p), nn.ReLU()]
            cin = out
    return nn.Sequential(*layers)


class _Lin(nn.Module):
    """1x1 conv to one channel without bias; `model.0` is the package's (eval-time inert) dropout."""

    def __init__(self, c):
        super().__init__()
        self.model = nn.Sequential(nn.Dropout(), nn.Conv2d(c, 1, 1, bias=False))


class LPIPS(nn.Module):
    def __init__(self, net: str = "alex"):
        super().__init__()
        if net not in TAPS:
            raise GenlabError(f"unknown eval.lpips_net '{net}'; valid choices: {', '.join(TAPS)}")
        self.net = net
        self.features = _features(net)[:TAPS[net][-1] + 1]  # layers after relu5 are never used
        for i, c in enumerate(CHANNELS[net]):
            self.add_module(f"lin{i}", _Lin(c))
        # v0.1 input scaling: ImageNet statistics expressed on the [-1, 1] scale
        self.register_buffer("shift", torch.tensor([-.030, -.088, -.188]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor([.458, .448, .450]).view(1, 3, 1, 1), persistent=False)

    def layer_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        h, out, taps = (x - self.shift) / self.scale, [], set(TAPS[self.net])
        for i, layer in enumerate(self.features):
            h = layer(h)
            if i in taps:
                out.append(h)
        return out

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x, y: float [B, 3, H, W] in [-1, 1] -> distance [B]."""
        total = 0
        for i, (fx, fy) in enumerate(zip(self.layer_features(x), self.layer_features(y))):
            fx, fy = (f / (f.pow(2).sum(1, keepdim=True).sqrt() + 1e-10) for f in (fx, fy))
            total = total + getattr(self, f"lin{i}").model((fx - fy) ** 2).mean((2, 3))
        return total.flatten()


def to_lpips_input(images_u8: torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W, C] -> float [B, 3, >=64, >=64] in [-1, 1] (grey replicated to RGB)."""
    x = to_model(images_u8)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if min(x.shape[-2:]) < MIN_SIZE:
        s = MIN_SIZE / min(x.shape[-2:])
        x = F.interpolate(x, size=(round(x.shape[-2] * s), round(x.shape[-1] * s)), mode="bilinear", align_corners=False)
    return x


@torch.no_grad()
def lpips_pairs(model: LPIPS, a_u8, b_u8, batch: int = 250, device=None) -> np.ndarray:
    """LPIPS between a[i] and b[i] (uint8 [n, H, W, C] each), float32 with autocast off."""
    device = device or next(model.parameters()).device
    out = []
    for i in range(0, len(a_u8), batch):
        xa, xb = (to_lpips_input(torch.as_tensor(np.asarray(u8[i:i + batch])).to(device)) for u8 in (a_u8, b_u8))
        with torch.autocast(torch.device(device).type, enabled=False):
            out.append(model(xa, xb).double().cpu())
    return torch.cat(out).numpy()


def same_class_pairs(labels: np.ndarray, n_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n_pairs index pairs (i != j, same label), cycling over the classes that have two members."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    groups = [g for g in groups if len(g) >= 2]
    if not groups:
        raise GenlabError("LPIPS diversity needs at least two samples of one class (raise eval.num_samples)")
    pairs = [rng.choice(groups[p % len(groups)], 2, replace=False) for p in range(n_pairs)]
    return np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])


def find_lpips_files(net: str, explicit: str = ""):
    """(backbone file, linear layers file)."""
    return tuple(find_file((name,), explicit, "GENLAB_LPIPS_WEIGHTS", "eval.lpips_weights", f"LPIPS ({net})", url)
                 for name, url in ((BACKBONE_FILES[net], BACKBONE_URLS[net]), (f"{net}.pth", LIN_URL.format(net=net))))


def load_lpips(net: str = "alex", explicit: str = "", device="cpu") -> LPIPS:
    """Strict loads: the backbone file's features.* (its classifier.* is not needed) and lin0..lin4."""
    backbone, lin = find_lpips_files(net, explicit)
    model = LPIPS(net)
    feats = {k[len("features."):]: v for k, v in load_state(backbone, "LPIPS backbone").items() if k.startswith("features.")}
    feats = {k: v for k, v in feats.items() if int(k.split(".")[0]) < len(model.features)}
    lins = {k: v for k, v in load_state(lin, "LPIPS linear layers").items() if k.startswith("lin")}
    try:
        model.features.load_state_dict(feats, strict=True)
        missing = [k for k in model.state_dict() if k.startswith("lin") and k not in lins]
        if missing:
            raise RuntimeError(f"missing {', '.join(missing)}")
        model.load_state_dict({**{f"features.{k}": v for k, v in feats.items()}, **lins}, strict=True)
    except RuntimeError as e:
        raise GenlabError(f"LPIPS weights {backbone.name} + {lin.name} do not fit LPIPS-{net}: "
                          f"{' '.join(str(e).split())[:300]}") from None
    return model.to(device).eval().requires_grad_(False)

"""The Inception-v3 network of FID (Heusel et al. 2017): the 2015-12-05 TensorFlow graph as pytorch-fid ports it,
without torchvision; torchvision's module names, so the published pt_inception weights load strictly. Its outputs
pool3, spatial and logits come from one pass (docs/fid.md).

Pretrained metric weights (this network's and LPIPS') are looked up in an explicit path (config key), an environment
variable, then torch's hub checkpoint folder ($TORCH_HOME/hub/checkpoints, by default ~/.cache/torch/hub/checkpoints),
the folder torch.hub / torchvision / pytorch-fid download into. Nothing is ever downloaded here."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.data.pixels import to_pixels

FID_WEIGHTS_NAMES = ("pt_inception-2015-12-05-6726825d.pth",      # pytorch-fid
                     "weights-inception-2015-12-05-6726825d.pth")  # torch-fidelity (same tensors)
FID_WEIGHTS_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth"
INPUT_SIZE = 299
SPATIAL_CHANNELS = 7        # ADM evaluator: spatial[..., :7] of mixed_6/conv:0
OUTPUTS = ("pool3", "spatial", "logits")


def hub_checkpoints() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def find_file(names: tuple[str, ...], explicit: str, env: str, key: str, what: str, url: str) -> Path:
    """The first existing file among `names` in the lookup folders (an explicit path may be the file
    itself); else a one-line GenlabError naming the places and how to get the file."""
    tried = []
    for label, p in (("config", explicit), (f"${env}", os.environ.get(env)), ("torch hub", hub_checkpoints())):
        if not p:
            continue
        p = Path(p).expanduser()
        if p.is_file() and label != "torch hub":
            return p
        for n in names:
            if (p / n).is_file():
                return p / n
        tried.append(str(p))
    if explicit and not Path(explicit).expanduser().exists():
        raise GenlabError(f"{key}={explicit} does not exist; {what} needs {names[0]} ({url})")
    raise GenlabError(f"{what} needs the weights file {names[0]}, not found in {', '.join(tried)} "
                      f"(set {key} or ${env}); download {url} into {hub_checkpoints()} (README: Evaluation metrics)")


def load_state(path: Path, what: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (truncated download, HTML error page saved as .pth)
        raise GenlabError(f"{what}: cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise GenlabError(f"{what}: {path} holds no state dict")
    return state


class BasicConv2d(nn.Module):
    """conv (no bias) -> batch norm (TF's epsilon 1e-3) -> ReLU."""

    def __init__(self, cin, cout, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg3(x):  # TF averages over the valid pixels only
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class InceptionA(nn.Module):  # 35x35 grid: 1x1 | 5x5 | double 3x3 | pool
    def __init__(self, cin, pool_features):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x):
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)),
                          self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          self.branch_pool(_avg3(x))], 1)


class InceptionB(nn.Module):  # 35 -> 17 grid reduction
    def __init__(self, cin):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x):
        return torch.cat([self.branch3x3(x), self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):  # 17x17 grid: factorised 7x7 convolutions
    def __init__(self, cin, c7):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = x
        for i in range(1, 6):
            d = getattr(self, f"branch7x7dbl_{i}")(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg3(x))], 1)


class InceptionD(nn.Module):  # 17 -> 8 grid reduction
    def __init__(self, cin):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x):
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):  # 8x8 grid: expanded 1x3 / 3x1 branches
    def __init__(self, cin, max_pool: bool):
        super().__init__()
        self.max_pool = max_pool  # the graph's last block (Mixed_7c) max-pools its pool branch
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        b3 = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg3(x)
        return torch.cat([self.branch1x1(x), self.branch3x3_2a(b3), self.branch3x3_2b(b3),
                          self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d), self.branch_pool(pooled)], 1)


class FIDInceptionV3(nn.Module):
    """x: float [B, 3, 299, 299] in [-1, 1] -> pool3 features [B, 2048]."""

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280, max_pool=False)
        self.Mixed_7c = InceptionE(2048, max_pool=True)
        self.fc = nn.Linear(2048, 1008)  # the graph's 1008-way softmax (the Inception Score reads its weight)

    def forward(self, x):
        return self.outputs(x, ("pool3",))["pool3"]

    def outputs(self, x, which=OUTPUTS) -> dict:
        """{name: [B, d]} for the names in `which` (pool3, spatial, logits) from one pass over the network."""
        out = {}
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, stride=2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
            if name == "6d" and "spatial" in which:
                # InceptionC concatenates its 1x1 branch first: channels [0, 192) are mixed_6/conv (after its ReLU);
                # NHWC flattening keeps the dimension order of the ADM reference files' mu_s / sigma_s
                out["spatial"] = x[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).flatten(1)
                if set(which) == {"spatial"}:
                    return out
        pool3 = x.mean((2, 3))
        if "pool3" in which:
            out["pool3"] = pool3
        if "logits" in which:
            out["logits"] = pool3 @ self.fc.weight.t()
        return out


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W, C] (C = 1 or 3) -> float [B, 3, 299, 299] in [-1, 1] as pytorch-fid feeds the network (grey
    replicated to RGB, bilinear resize to 299, 2x - 1). Float [B, C, H, W] model outputs in [-1, 1] are rounded to
    uint8 pixels first, as the ADM evaluator reads saved samples; a float batch outside [-1, 1] is refused."""
    if images.dtype.is_floating_point:
        lo, hi = float(images.min()), float(images.max())
        if lo < -1.001 or hi > 1.001:  # a little slack for a sampler's overshoot, which to_pixels clamps
            raise ValueError(f"float images must be model outputs in [-1, 1] ([B, C, H, W]), got values in "
                             f"[{lo:.4g}, {hi:.4g}]; pass uint8 [B, H, W, C] pixels instead")
        images = to_pixels(images)
    elif images.dtype != torch.uint8:
        raise ValueError(f"FID needs uint8 [B, H, W, C] pixels or float [B, C, H, W] in [-1, 1], got {images.dtype}")
    x = images.permute(0, 3, 1, 2).float() / 255.0
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif x.shape[1] != 3:
        raise ValueError(f"FID needs 1- or 3-channel images [B, H, W, C], got {x.shape[1]} channels (shape "
                         f"{list(images.shape)})")
    x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
    return 2 * x - 1


@torch.no_grad()
def inception_outputs(net: FIDInceptionV3, images_u8, batch: int = 100, device=None, which=OUTPUTS) -> dict:
    """{name: float64 [n, d]} of uint8 [n, H, W, C] images or float [n, C, H, W] model outputs (see preprocess),
    for the names in `which` (from OUTPUTS), computed in float32 with autocast off."""
    device = device or next(net.parameters()).device
    dev_type = torch.device(device).type
    out = {k: [] for k in which}
    for i in range(0, len(images_u8), batch):
        chunk = images_u8[i:i + batch]
        x = (chunk if torch.is_tensor(chunk) else torch.from_numpy(np.array(chunk))).to(device)  # a copy: memmaps are read-only
        with torch.autocast(dev_type, enabled=False):
            res = net.outputs(preprocess(x), tuple(which))
        for k in which:
            out[k].append(res[k].double().cpu())
    return {k: torch.cat(v).numpy() for k, v in out.items()}


def inception_features(net: FIDInceptionV3, images_u8, batch: int = 100, device=None) -> np.ndarray:
    """pool3 features [n, 2048] (float64) of uint8 [n, H, W, C] images."""
    return inception_outputs(net, images_u8, batch, device, ("pool3",))["pool3"]


def find_fid_weights(explicit: str = ""):
    return find_file(FID_WEIGHTS_NAMES, explicit, "GENLAB_FID_WEIGHTS", "eval.fid_weights",
                     "FID (Inception-v3, 2015-12-05 graph)", FID_WEIGHTS_URL)


def load_fid_inception(explicit: str = "", device="cpu") -> FIDInceptionV3:
    """Strict load; files converted without BatchNorm step counters (torch-fidelity's) get zeros."""
    path = find_fid_weights(explicit)
    net, state = FIDInceptionV3(), load_state(path, "FID weights")
    for k, v in net.state_dict().items():
        if k.endswith("num_batches_tracked") and k not in state:
            state[k] = torch.zeros_like(v)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise GenlabError(f"FID weights {path} do not fit the FID Inception network: {' '.join(str(e).split())[:300]}") from None
    return net.to(device).eval().requires_grad_(False)

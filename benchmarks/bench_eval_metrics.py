"""Evaluation metrics on one dataset: the real-vs-real floor at several sample counts (training images scored as if they
were samples, against the held-out split) and the throughput of the FID Inception and LPIPS networks (random weights:
the speed does not depend on them); or (--fid-protocol WEIGHTS) a check of the whole FID pipeline against published
real-vs-real figures (docs/fid.md, "Checking the pipeline").

    PYTHONPATH=src python benchmarks/bench_eval_metrics.py --data gpu_data/mnist_train --val gpu_data/mnist_test [--speed]
    PYTHONPATH=src python benchmarks/bench_eval_metrics.py --fid-protocol ~/pt_inception-2015-12-05-6726825d.pth \\
        --data data/cifar10_train --val data/cifar10_test --expect cifar10

--fid-protocol needs the published Inception weights (a download); what it computes through genlab's own code path
(FID, sFID, the Inception Score two ways, FID with two deliberate input mistakes) and the PUBLISHED figures it is
compared with (`--expect cifar10`): docs/fid.md, "Checking the pipeline".
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from common import wall_ms

from genlab.config.tree import load_config
from genlab.core.tables import markdown_row, markdown_table
from genlab.data.formats import read_image_dataset
from genlab.eval.frechet import frechet_from_stats
from genlab.eval.inception import INPUT_SIZE, FIDInceptionV3, inception_features, inception_outputs, load_fid_inception
from genlab.eval.inception_score import inception_score
from genlab.eval.lpips import LPIPS, lpips_pairs
from genlab.eval.metrics import image_metrics
from genlab.eval.ref_stats import _Moments

# figure -> (value, tolerance, source). The IS is torch-fidelity's README (`fidelity --isc --input1 cifar10-train`:
# 11.23678, std 0.0951); the FID (about 3.1) a user's figure, not a maintainer's: a sanity range, not an exact target
PUBLISHED = {"cifar10": {"is_train": (11.23678, 0.25, "torch-fidelity README, CIFAR-10 train IS"),
                         "fid_train_test": (3.1, 0.5, "NVlabs/stylegan2-ada#53 (user figure), FID train 50k vs test 10k")}}


def stream(net, images, batch, device, chunk=2000, logits=False):
    """Streamed pool3 + spatial moments (as `genlab data ref-stats`), and the logits when asked."""
    pool, spatial, lg = _Moments(), _Moments(), []
    which = ("pool3", "spatial", "logits") if logits else ("pool3", "spatial")
    t0 = time.perf_counter()
    for i in range(0, len(images), chunk):
        out = inception_outputs(net, np.asarray(images[i:i + chunk]), batch=batch, device=device, which=which)
        pool.add(out["pool3"])
        spatial.add(out["spatial"])
        if logits:
            lg.append(out["logits"])
    dt = time.perf_counter() - t0
    return pool.result(), spatial.result(), (np.concatenate(lg) if logits else None), len(images) / dt


@torch.no_grad()
def mistaken_stats(net, images, batch, device, mistake):
    """pool3 moments with one deliberate input mistake."""
    m = _Moments()
    for i in range(0, len(images), batch):
        x = torch.from_numpy(np.array(images[i:i + batch])).to(device).permute(0, 3, 1, 2).float() / 255
        x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
        if mistake == "nearest resize":
            x = 2 * F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="nearest") - 1
        elif mistake == "pixels in [0, 1]":
            x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
        m.add(net.outputs(x, ("pool3",))["pool3"].double().cpu().numpy())
    return m.result()


def fid_protocol(a) -> int:
    net = load_fid_inception(a.fid_protocol, a.device)
    tr, te = read_image_dataset(a.data).images, read_image_dataset(a.val).images
    if a.limit:
        tr, te = tr[:a.limit], te[:a.limit]
    (mu_tr, s_tr), (mus_tr, ss_tr), logits, ips = stream(net, tr, a.batch, a.device, logits=True)
    (mu_te, s_te), (mus_te, ss_te), _, _ = stream(net, te, a.batch, a.device)
    rows = [("FID train vs test", frechet_from_stats(mu_tr, s_tr, mu_te, s_te), "fid_train_test"),
            ("sFID train vs test", frechet_from_stats(mus_tr, ss_tr, mus_te, ss_te), None),
            ("IS train (10 consecutive splits)", inception_score(logits, 10)[0], "is_train"),
            ("IS train (torch-fidelity: shuffled, seed 2020)",
             inception_score(logits[np.random.RandomState(2020).permutation(len(logits))], 10)[0], "is_train")]
    if a.mistakes:
        sub = te[:a.mistakes]
        ok = stream(net, sub, a.batch, a.device)[0]
        for mistake in ("nearest resize", "pixels in [0, 1]"):
            rows.append((f"FID test[:{len(sub)}] correct vs {mistake}", frechet_from_stats(*ok, *mistaken_stats(
                net, sub, a.batch, a.device, mistake)), None))
    print(f"{len(tr)} train / {len(te)} test images, {a.device}, {ips:.3g} img/s\n")
    cells, failed = [], False
    for name, v, key in rows:
        target, tol, src = PUBLISHED.get(a.expect, {}).get(key) or (None, 0, "")
        ok = target is None or abs(v - target) <= tol
        failed |= not ok
        cells.append([name, f"{v:.4f}", *(["-", "-"] if target is None else [f"{target} ({src})", f"{'yes' if ok else 'NO'} (±{tol})"])])
    print(markdown_table(["figure", "genlab", "published", "within"], cells, "llll"))
    return 1 if failed else 0


def floors(data, val, ns, device):
    print(markdown_table(["n", "reference", "feature FD (train images as samples)", "floor", "precision", "recall",
                          "sample acc"], [], "lllllll"))
    for n in ns:
        cfg = load_config("mnist_flow", [f"data.path={data}", f"eval.val_path={val}", f"eval.num_samples={n}"])
        d = read_image_dataset(data)
        idx = np.sort(np.random.default_rng(123).choice(len(d), n, replace=False))
        res = image_metrics(torch.from_numpy(np.asarray(d.images[idx])), torch.from_numpy(np.asarray(d.labels[idx])), d,
                            {"eval": cfg.eval, "device": device})
        print(markdown_row([n, res["reference"], f"{res['feature_fd']:.3f}", f"{res['feature_fd_floor']:.3f}",
                            f"{res['precision']:.3f}", f"{res['recall']:.3f}", f"{res['sample_accuracy']:.4f}"]), flush=True)


def throughput(device, side, channels):
    imgs = torch.randint(0, 256, (1000, side, side, channels), dtype=torch.uint8)
    print(markdown_table(["network", "images", "img/s"], [], "lll"))
    nets = [("FID Inception-v3 (299 px)", FIDInceptionV3().to(device).eval(), lambda m: inception_features(m, imgs, 200, device))]
    nets += [(f"LPIPS-{name} (pairs)", LPIPS(name).to(device).eval(), lambda m: lpips_pairs(m, imgs, imgs.flip(0), 250, device))
             for name in ("alex", "vgg")]
    for label, net, fn in nets:
        ms = wall_ms(lambda: fn(net), 1, warmup=1, device=device)  # the warm-up call: cuDNN autotune
        print(markdown_row([label, f"{len(imgs)} of {side}x{side}x{channels}", f"{1e3 * len(imgs) / ms:.0f}"]), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a prepared image set (the 'generated' side, e.g. the train split)")
    ap.add_argument("--val", required=True, help="a prepared image set (the reference side, e.g. the test split)")
    ap.add_argument("--ns", default="500,2000,5000", help="sample counts of the floor")
    ap.add_argument("--speed", action="store_true", help="also the FID Inception and LPIPS throughput")
    ap.add_argument("--fid-protocol", metavar="WEIGHTS", help="pt_inception-2015-12-05-6726825d.pth or its folder")
    ap.add_argument("--limit", type=int, default=0, help="--fid-protocol: first LIMIT images of each split (0 = all)")
    ap.add_argument("--mistakes", type=int, default=2000, help="--fid-protocol: test images scored with each input mistake (0 = skip)")
    ap.add_argument("--expect", default="", choices=("", *PUBLISHED), help="--fid-protocol: compare with this dataset's published figures")
    ap.add_argument("--batch", type=int, default=200, help="--fid-protocol")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.fid_protocol:
        raise SystemExit(fid_protocol(a))
    floors(a.data, a.val, [int(x) for x in a.ns.split(",")], dev)
    if a.speed:
        d = read_image_dataset(a.data)
        throughput(dev, d.images.shape[1], d.images.shape[3])

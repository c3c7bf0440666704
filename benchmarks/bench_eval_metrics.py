"""Evaluation metrics on one dataset: the real-vs-real floor at several sample counts (training images
scored as if they were samples, against the held-out split) and the throughput of the FID Inception and
LPIPS networks (random weights: the speed does not depend on them). Prints Markdown tables.

    PYTHONPATH=src python benchmarks/bench_eval_metrics.py --data gpu_data/mnist_train --val gpu_data/mnist_test
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from genlab.config.tree import load_config
from genlab.core.tables import markdown_row, markdown_table
from genlab.data.formats import read_image_dataset
from genlab.eval.metrics import image_metrics


def floors(data, val, ns, device):
    print(markdown_table(["n", "reference", "feature FD (train images as samples)", "floor", "precision", "recall",
                          "sample acc"], [], "lllllll"))
    for n in ns:
        cfg = load_config("mnist_flow", [f"data.path={data}", f"eval.val_path={val}", f"eval.num_samples={n}"])
        d = read_image_dataset(data)
        idx = np.random.default_rng(123).choice(len(d), n, replace=False)
        res = image_metrics(torch.from_numpy(np.asarray(d.images[np.sort(idx)])),
                            torch.from_numpy(np.asarray(d.labels[np.sort(idx)])), d, {"eval": cfg.eval, "device": device})
        print(markdown_row([n, res["reference"], f"{res['feature_fd']:.3f}", f"{res['feature_fd_floor']:.3f}",
                            f"{res['precision']:.3f}", f"{res['recall']:.3f}", f"{res['sample_accuracy']:.4f}"]), flush=True)


def throughput(device, side, channels):
    from genlab.eval.inception import FIDInceptionV3, inception_features
    from genlab.eval.lpips import LPIPS, lpips_pairs
    imgs = torch.randint(0, 256, (1000, side, side, channels), dtype=torch.uint8)
    print(markdown_table(["network", "images", "img/s"], [], "lll"))
    nets = [("FID Inception-v3 (299 px)", FIDInceptionV3().to(device).eval(), lambda m: inception_features(m, imgs, 200, device))]
    for name in ("alex", "vgg"):
        nets.append((f"LPIPS-{name} (pairs)", LPIPS(name).to(device).eval(), lambda m: lpips_pairs(m, imgs, imgs.flip(0), 250, device)))
    for label, net, fn in nets:
        fn(net)  # warm-up (cuDNN autotune)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(net)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(markdown_row([label, f"{len(imgs)} of {side}x{side}x{channels}", f"{len(imgs) / (time.perf_counter() - t):.0f}"]),
              flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--ns", default="500,2000,5000")
    ap.add_argument("--speed", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    floors(a.data, a.val, [int(x) for x in a.ns.split(",")], dev)
    if a.speed:
        d = read_image_dataset(a.data)
        throughput(dev, d.images.shape[1], d.images.shape[3])

"""Image-sample metrics (eval.metrics, registry `eval_metric`). Every distance compares the samples with the held-out
real images (real_split.py) beside its real-vs-real floor (train images vs held-out at the same count); the Inception
metrics (fid, sfid, pr_inception) compare with eval.fid_ref instead when set: the ADM / DiT protocol (docs/fid.md)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from genlab.config import fields as cf
from genlab.core import progress
from genlab.core.errors import GenlabError, did_you_mean
from genlab.core.registry import Registry, Spec
from genlab.data.pixels import to_model
from genlab.eval.classifier import get_classifier, predict
from genlab.eval.frechet import frechet_from_stats, gaussian_stats
from genlab.eval.inception import find_fid_weights, inception_outputs, load_fid_inception
from genlab.eval.inception_score import inception_score as score
from genlab.eval.lpips import find_lpips_files, load_lpips, lpips_pairs, same_class_pairs
from genlab.eval.real_split import real_split
from genlab.eval.ref_stats import load_reference


@dataclass(frozen=True, kw_only=True)
class MetricSpec(Spec):
    check: Callable | None = None          # check(cfg.eval): before training or sampling (weights present, enough samples)


eval_metric_registry = Registry("eval_metric", MetricSpec)

# Inception feature spaces -> the network output (inception.OUTPUTS) each is
INCEPTION_SPACES = {"inception": "pool3", "inception_spatial": "spatial", "inception_logits": "logits"}


# eval.* keys of the image metrics: the classifier and reference set every metric shares, then each metric's own
class EvalImageKeys(cf.Keys, section="eval"):
    classifier_epochs: int = cf.F(30, "flow: epochs of the in-project feature classifier", ge=1)
    val_path: str = cf.F("", "held-out images folder, e.g. the test split (flow: reference of FD/FID/precision-recall and the "
                             "real-vs-real floor, empty: a fixed half of the training images; image_ar: bits/dim, empty: the last "
                             "eval.num_samples training images)", free="a folder made by `genlab data prepare`")


class RefKeys(cf.Keys, section="eval"):
    ref_samples: int = cf.F(10000, "flow: held-out images in the reference set of FD/FID (at most the held-out split)", ge=2)


class PrKeys(cf.Keys, section="eval"):
    pr_k: int = cf.F(3, "flow: k of the k-NN manifolds of precision/recall (Kynkäänniemi et al. 2019)", ge=1)


class FidKeys(cf.Keys, section="eval"):
    fid_weights: str = cf.F("", "flow: FID Inception weights pt_inception-2015-12-05-6726825d.pth, a file or its folder "
                                "(empty: $GENLAB_FID_WEIGHTS, then $TORCH_HOME/hub/checkpoints)", free="a file or folder path")


class FidRefKeys(cf.Keys, section="eval"):
    fid_ref: str = cf.F("", "flow: reference .npz of fid/sfid/pr_inception instead of the held-out images: an ADM reference batch "
                            "(arr_0 images and/or mu, sigma, mu_s, sigma_s) or clean-fid/torch-fidelity/pytorch-fid mu+sigma "
                            "statistics (empty: the held-out images); the standard protocol scores eval.num_samples=50000 "
                            "samples (docs/fid.md)", free="an .npz file path")


PROTOCOL_SAMPLES = 50000  # ADM / DiT / EDM papers: FID of 50,000 samples against the reference statistics
IS_SPLITS = 10  # the Inception Score's splits (ADM: 50,000 samples in splits of 5,000)


class LpipsKeys(cf.Keys, section="eval"):
    lpips_net: str = cf.F("alex", "flow: LPIPS backbone (v0.1 linear layers)", choices=("alex", "vgg"))
    lpips_weights: str = cf.F("", "flow: folder with the LPIPS files (alexnet-owt-7be5be79.pth or vgg16-397923af.pth + alex.pth "
                                  "or vgg.pth; empty: $GENLAB_LPIPS_WEIGHTS, then $TORCH_HOME/hub/checkpoints)", free="a folder path")
    lpips_pairs: int = cf.F(500, "flow: same-class sample pairs averaged by the LPIPS diversity", ge=1)


# improved precision and recall (Kynkäänniemi et al. 2019): the share of each set inside the other's k-NN manifold
def _cdist_rows(query: torch.Tensor, support: torch.Tensor, fn, chunk: int = 1024) -> torch.Tensor:
    """fn(distances of a chunk of query rows to every support point), concatenated over the chunks."""
    return torch.cat([fn(torch.cdist(query[i:i + chunk], support)) for i in range(0, len(query), chunk)])


def knn_radii(feats: torch.Tensor, k: int) -> torch.Tensor:
    """Distance from every point to its k-th nearest neighbour among the others."""
    if not 1 <= k < len(feats):
        raise ValueError(f"k={k} needs at least k+1={k + 1} points, got {len(feats)}")
    return _cdist_rows(feats, feats, lambda d: d.kthvalue(k + 1, dim=1).values)  # the point itself is the 1st (distance 0)


def coverage(query: torch.Tensor, support: torch.Tensor, radii: torch.Tensor) -> torch.Tensor:
    """Bool per query point: inside some ball B(support_i, radii_i)."""
    return _cdist_rows(query, support, lambda d: (d <= radii[None, :]).any(dim=1))


def precision_recall(real, fake, k: int = 3, device=None) -> tuple[float, float]:
    """(precision, recall) of fake [m, d] against real [n, d] features, distances in float64."""
    device = device or (real.device if torch.is_tensor(real) else "cpu")
    r, f = (torch.as_tensor(x if torch.is_tensor(x) else np.asarray(x, dtype=np.float64), dtype=torch.float64,
                            device=device) for x in (real, fake))
    precision = coverage(f, r, knn_radii(r, k)).double().mean().item()
    recall = coverage(r, f, knn_radii(f, k)).double().mean().item()
    return precision, recall


_CACHE: dict = {}                    # real-image features and stats, reused across periodic evaluations
_CACHE_MAX = 32


def parse_metrics(text: str) -> list[str]:
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    valid = eval_metric_registry.names()
    if not names:
        raise GenlabError(f"eval.metrics is empty; valid choices: {', '.join(valid)} (eval.num_samples=0 turns eval off)")
    for n in names:
        if n not in valid:
            raise GenlabError(f"unknown eval.metrics entry '{n}'{did_you_mean(n, valid)}; valid choices: {', '.join(valid)}")
    return list(dict.fromkeys(names))


def check_metrics(ecfg) -> list[str]:
    """Names valid and every weights file present: called before training or sampling starts."""
    names = parse_metrics(ecfg.metrics)
    for n in names:
        check = eval_metric_registry.spec(n).check
        if check is not None:
            check(ecfg)
    return names


def _file_key(path: str):
    """A file's identity for the caches: a rewritten reference file is another reference."""
    if not path:
        return None
    p = Path(path).expanduser()
    st = p.stat() if p.is_file() else None
    return (str(p.resolve()), st.st_size, st.st_mtime_ns) if st else (str(p),)


def _cached(key, fn):
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = fn()
    return _CACHE[key]


class Evaluation:
    """One evaluation: the generated samples, the real split, and feature sets computed once each."""

    def __init__(self, samples_u8: torch.Tensor, labels: torch.Tensor, data, ctx):
        self.samples = samples_u8.cpu()
        self.labels = labels.cpu()
        self.data, self.ecfg, self.device = data, ctx["eval"], ctx["device"]
        self.n = len(self.samples)
        self.data_key = (data.meta.get("sha256") or f"id{id(data)}", self.ecfg.val_path, self.ecfg.ref_samples, self.n,
                         _file_key(self.ecfg.fid_ref))
        self.split = _cached(("split", *self.data_key),
                             lambda: real_split(data, self.ecfg.val_path, self.n, self.ecfg.ref_samples))
        # a caller scoring several variants of one model (genlab analyze) passes one classifier, so every variant is
        # scored in the same feature space even when a weak classifier is not cached
        self._gen = {"classifier": ctx["classifier"]} if ctx.get("classifier") is not None else {}

    def _once(self, key, fn):
        """fn() computed once per evaluation (features of these samples)."""
        if key not in self._gen:
            self._gen[key] = fn()
        return self._gen[key]

    def classifier(self):
        keys = EvalImageKeys.of(self.ecfg)
        return self._once("classifier", lambda: get_classifier(self.data, device=self.device, epochs=keys.classifier_epochs))

    def _classify(self, images_u8):
        net, _ = self.classifier()
        x = to_model(torch.as_tensor(np.asarray(images_u8)).to(self.device))
        with torch.autocast(torch.device(self.device).type, enabled=False):
            logits, f = predict(net, x, return_features=True)
        return logits.float().cpu(), f.double().cpu().numpy()

    def gen_logits_features(self):
        return self._once("clf_gen", lambda: self._classify(self.samples))

    def features(self, space: str, which: str) -> np.ndarray:
        """[n, d] float64 features of 'gen', 'ref' (held-out, or eval.fid_ref's images in Inception spaces) or 'train'
        (train subset) in a feature space: classifier, or inception / inception_spatial / inception_logits (one pass
        of the Inception network gives all three)."""
        if space in INCEPTION_SPACES:
            return self._inception_outputs(which)[INCEPTION_SPACES[space]]
        if space != "classifier":
            raise ValueError(space)
        if which == "gen":
            return self.gen_logits_features()[1]
        images = self.split.held_out if which == "ref" else self.split.train
        return _cached((space, which, self._space_key(space), *self.data_key), lambda: self._classify(images)[1])

    def _inception_outputs(self, which: str) -> dict:
        if which == "gen":
            return self._once("inception", lambda: self._inception_pass(self.samples))
        ref = self.reference()
        if which == "ref" and ref is not None:
            return _cached(("inception", "ref_file", self.ecfg.fid_weights, _file_key(self.ecfg.fid_ref)),
                           lambda: self._inception_pass(ref.images()))
        images = self.split.held_out if which == "ref" else self.split.train
        return _cached(("inception", which, self.ecfg.fid_weights, *self.data_key), lambda: self._inception_pass(images))

    def _inception_pass(self, images_u8) -> dict:
        return inception_outputs(self.inception(), images_u8, batch=min(self.ecfg.batch_size, 200), device=self.device)

    def reference(self):
        """eval.fid_ref's Reference (ref_stats.py), or None when the Inception metrics use the held-out images."""
        keys = FidRefKeys.of(self.ecfg)
        if not keys.fid_ref:
            return None
        return _cached(("fid_ref", _file_key(keys.fid_ref)), lambda: load_reference(keys.fid_ref))

    def ref_gaussian(self, space: str) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma) of the reference: eval.fid_ref's stored statistics when it has them (as the ADM evaluator
        prefers them to its images), else those of the reference features."""
        keys = FidRefKeys.of(self.ecfg)
        ref = self.reference() if space in INCEPTION_SPACES else None
        if ref is not None and ref.has_stats(space):
            return _cached(("ref_stats", space, _file_key(keys.fid_ref)), lambda: ref.stats(space))
        return _cached(("stats", space, self._space_key(space), *self.data_key),
                       lambda: gaussian_stats(self.features(space, "ref")))

    def _space_key(self, space):
        keys = FidKeys.of(self.ecfg)
        if space == "classifier":  # a fingerprint of the weights: a retrained classifier is another feature space
            net = self.classifier()[0]
            return (sum(float(v.double().sum()) for v in net.state_dict().values()),)
        return (keys.fid_weights,)

    def inception(self):
        keys = FidKeys.of(self.ecfg)
        return _cached(("inception_net", keys.fid_weights, str(self.device)),
                       lambda: load_fid_inception(keys.fid_weights, self.device))

    def fd_pair(self, space: str) -> tuple[float, float]:
        """(FD of the samples, real-vs-real floor), both against the reference Gaussian (ref_gaussian)."""
        ref = self.ref_gaussian(space)
        floor = _cached(("floor", space, self._space_key(space), *self.data_key),
                        lambda: frechet_from_stats(*gaussian_stats(self.features(space, "train")), *ref))
        return frechet_from_stats(*gaussian_stats(self.features(space, "gen")), *ref), floor

    def pr_pair(self, space: str) -> dict:
        """Precision/recall of the samples and of the train subset, against n held-out images, or against all of
        eval.fid_ref's images in Inception space (as the ADM evaluator: its 10,000 against the 50,000 samples)."""
        k = self.ecfg.pr_k
        ref = self.features(space, "ref")
        ref = ref if space in INCEPTION_SPACES and self.ecfg.fid_ref else ref[: self.n]
        p, r = precision_recall(ref, self.features(space, "gen"), k=k, device=self.device)
        pf, rf = _cached(("pr_floor", space, k, self._space_key(space), *self.data_key),
                         lambda: precision_recall(ref, self.features(space, "train"), k=k, device=self.device))
        return {"precision": p, "recall": r, "precision_floor": pf, "recall_floor": rf}


@eval_metric_registry.register("accuracy", "sample accuracy: the in-project classifier agrees with the requested class")
def accuracy(ev: Evaluation) -> dict:
    logits, _ = ev.gen_logits_features()
    return {"sample_accuracy": (logits.argmax(-1) == ev.labels).float().mean().item(),
            "classifier_val_acc": ev.classifier()[1]}


@eval_metric_registry.register("fd", "Fréchet distance in the in-project classifier's feature space + real-vs-real floor",
                               keys=RefKeys, check=lambda ecfg: _at_least(ecfg, 2, "fd"))  # a covariance needs two samples
def fd(ev: Evaluation) -> dict:
    v, floor = ev.fd_pair("classifier")
    return {"feature_fd": v, "feature_fd_floor": floor, "classifier_val_acc": ev.classifier()[1]}


@eval_metric_registry.register("pr", "precision/recall, k-NN manifolds (Kynkäänniemi et al. 2019) in the classifier's feature space",
                               keys=(RefKeys, PrKeys),  # the k-th neighbour of a point among the others
                               check=lambda ecfg: _at_least(ecfg, ecfg.pr_k + 1, "pr"))
def pr(ev: Evaluation) -> dict:
    return ev.pr_pair("classifier")


@eval_metric_registry.register("fid", "FID: Fréchet distance of Inception-v3 pool3 features (Heusel et al. 2017; needs weights), "
                               "against eval.fid_ref when set",
                               keys=(RefKeys, FidKeys, FidRefKeys),
                               check=lambda ecfg: _check_inception(ecfg, 2, "fid", "inception"))
def fid(ev: Evaluation) -> dict:
    v, floor = ev.fd_pair("inception")
    return {"fid": v, "fid_floor": floor}


@eval_metric_registry.register("sfid", "sFID: Fréchet distance of Inception mixed_6/conv[..., :7] features, 7x17x17 = 2023-d "
                               "(Nash et al. 2021, as the ADM evaluator; needs weights)",
                               keys=(RefKeys, FidKeys, FidRefKeys),
                               check=lambda ecfg: _check_inception(ecfg, 2, "sfid", "inception_spatial"))
def sfid(ev: Evaluation) -> dict:
    v, floor = ev.fd_pair("inception_spatial")
    return {"sfid": v, "sfid_floor": floor}


@eval_metric_registry.register("inception_score", f"Inception Score over {IS_SPLITS} splits (Salimans et al. 2016; softmax of "
                               "the FID Inception's 1008 logits without bias, as the ADM evaluator; needs weights)",
                               keys=FidKeys, check=lambda ecfg: _check_inception(ecfg, IS_SPLITS, "inception_score"))
def inception_score(ev: Evaluation) -> dict:
    keys = FidKeys.of(ev.ecfg)
    mean, std = score(ev.features("inception_logits", "gen"), IS_SPLITS)
    real = _cached(("is_real", keys.fid_weights, *ev.data_key),
                   lambda: score(ev.features("inception_logits", "train"), IS_SPLITS)[0])
    return {"inception_score": mean, "inception_score_std": std, "inception_score_real": real}


@eval_metric_registry.register("pr_inception", "precision/recall, k-NN manifolds (Kynkäänniemi et al. 2019) in Inception pool3 "
                               "space, against eval.fid_ref's images when set (as the ADM evaluator; needs weights)",
                               keys=(RefKeys, PrKeys, FidKeys, FidRefKeys),
                               check=lambda ecfg: _check_inception(ecfg, ecfg.pr_k + 1, "pr_inception", "images"))
def pr_inception(ev: Evaluation) -> dict:
    return {f"inception_{k}": v for k, v in ev.pr_pair("inception").items()}


def _check_inception(ecfg, at_least: int, what: str, needs: str | None = None):
    """Before sampling: enough samples, the weights file, and a reference file that holds what the metric reads."""
    keys = FidRefKeys.of(ecfg)
    _at_least(ecfg, at_least, what)
    find_fid_weights(FidKeys.of(ecfg).fid_weights)
    if needs and keys.fid_ref:
        ref = load_reference(keys.fid_ref)
        ok = ref.has_images if needs == "images" else ref.can_serve(needs)
        if not ok:
            wanted = {"inception_spatial": "spatial statistics (mu_s, sigma_s) or images (arr_0)",
                      "inception": "pool3 statistics (mu, sigma) or images (arr_0)", "images": "images (arr_0)"}[needs]
            raise GenlabError(f"eval.metrics={what} needs {wanted} in eval.fid_ref; {ref.path.name} holds "
                              f"{', '.join(ref.headers)} (write one with `genlab data ref-stats`)")


def protocol_metrics(fid_ref: str) -> str:
    """The standard protocol's metrics that a reference file supports: fid and inception_score always, sfid with
    spatial statistics or images, pr_inception with images."""
    ref = load_reference(fid_ref)
    names = ["fid", "sfid" if ref.can_serve("inception_spatial") else None, "inception_score",
             "pr_inception" if ref.has_images else None]
    return ",".join(n for n in names if n)


def _at_least(ecfg, k: int, what: str):
    if ecfg.num_samples < k:
        raise GenlabError(f"eval.metrics={what} needs eval.num_samples >= {k}, got {ecfg.num_samples}")


@eval_metric_registry.register("lpips", "LPIPS diversity: mean LPIPS between same-class samples (Zhang et al. 2018; needs weights)",
                                keys=LpipsKeys, check=lambda ecfg: find_lpips_files(ecfg.lpips_net, ecfg.lpips_weights))
def lpips(ev: Evaluation) -> dict:
    e = ev.ecfg
    model = _cached(("lpips_net", e.lpips_net, e.lpips_weights, str(ev.device)),
                    lambda: load_lpips(e.lpips_net, e.lpips_weights, ev.device))
    i, j = same_class_pairs(ev.labels.numpy(), e.lpips_pairs, seed=0)
    gen = float(lpips_pairs(model, ev.samples[i], ev.samples[j], e.batch_size, ev.device).mean())

    def real():
        a, b = same_class_pairs(ev.split.held_out_labels, e.lpips_pairs, seed=1)
        return float(lpips_pairs(model, ev.split.held_out[a], ev.split.held_out[b], e.batch_size, ev.device).mean())
    return {"lpips_diversity": gen,
            "lpips_diversity_real": _cached(("lpips_real", e.lpips_net, e.lpips_pairs, *ev.data_key), real)}


def image_metrics(samples_u8: torch.Tensor, labels: torch.Tensor, data, ctx) -> dict:
    """Every metric of eval.metrics on uint8 [n, H, W, C] samples drawn for `labels`."""
    ev = Evaluation(samples_u8, labels, data, ctx)
    res = {}
    for name in parse_metrics(ctx["eval"].metrics):
        res.update(eval_metric_registry.get(name)(ev))
    res.update({"eval_samples": ev.n, "reference": ev.split.source, "floor_samples": len(ev.split.train)})
    if ev.reference() is not None:  # set only with a metric that reads it (config validation)
        res["fid_reference"] = ev.reference().describe()
    if progress.is_on():
        print(summary_line(res), file=sys.stderr, flush=True)
    return res


# the console line's part of each metric: (the result key that shows it, its format)
SUMMARY_PARTS = (
    ("sample_accuracy", "sample accuracy: {sample_accuracy:.1%} (classifier held-out acc {classifier_val_acc:.1%})"),
    ("feature_fd", "feature FD {feature_fd:.4g} (real-vs-real floor {feature_fd_floor:.4g})"),
    ("precision", "precision {precision:.3f} recall {recall:.3f} (real-vs-real {precision_floor:.3f} / {recall_floor:.3f})"),
    ("fid", "FID {fid:.4g}{_ref} (real-vs-real floor {fid_floor:.4g})"),
    ("sfid", "sFID {sfid:.4g} (real-vs-real floor {sfid_floor:.4g})"),
    ("inception_score", "IS {inception_score:.4g} ± {inception_score_std:.2g} (real images {inception_score_real:.4g})"),
    ("inception_precision", "Inception precision {inception_precision:.3f} recall {inception_recall:.3f} "
                            "(real-vs-real {inception_precision_floor:.3f} / {inception_recall_floor:.3f})"),
    ("lpips_diversity", "LPIPS diversity {lpips_diversity:.4f} (real {lpips_diversity_real:.4f})"),
)


def summary_line(res: dict) -> str:
    """One console line; every distance carries its real-vs-real floor."""
    ref = f" vs {res['fid_reference']}" if "fid_reference" in res else ""
    parts = [fmt.format(**res, _ref=ref) for key, fmt in SUMMARY_PARTS if key in res]
    floor_n = res.get("floor_samples")
    n_note = f"; floor from {floor_n} train images" if floor_n is not None and floor_n != res.get("eval_samples") else ""
    if "fid_reference" in res and res.get("eval_samples") != PROTOCOL_SAMPLES:
        n_note += f"; the standard protocol scores {PROTOCOL_SAMPLES:,} samples"
    return f"eval ({res.get('eval_samples')} samples vs {res.get('reference')}{n_note}): " + " | ".join(parts)

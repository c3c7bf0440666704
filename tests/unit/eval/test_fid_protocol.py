"""The standard FID protocol (docs/fid.md): reference statistics files (eval.fid_ref) in the ADM and clean-fid /
torch-fidelity / pytorch-fid layouts, sFID / Inception Score / precision-recall from the same Inception pass, the
ref-stats writer, and the input path (uint8 pixels and float model outputs of the same pixels agree). The published
Inception weights cannot be downloaded here: the network runs with stand-in random weights whose BatchNorm statistics
are calibrated so activations keep their scale through depth (features of default-initialised weights vanish, ~1e-8)."""
import json
import re
import zipfile

import numpy as np
import pytest
import torch
from conftest import patch_everywhere

from genlab.core.errors import GenlabError
from genlab.eval.frechet import frechet_from_stats, gaussian_stats
from genlab.eval.inception_score import inception_score
from genlab.eval.ref_stats import _Moments, load_reference, write_reference

WEIGHTS = "pt_inception-2015-12-05-6726825d.pth"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """(network, weights folder): random weights, BatchNorm statistics of one batch of noise images (cumulative
    average), saved under the published file name."""
    from genlab.eval.inception import FIDInceptionV3, preprocess
    torch.manual_seed(0)
    net = FIDInceptionV3()
    torch.nn.init.normal_(net.fc.bias)  # a non-zero bias: the Inception Score must not read it
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        net.train()(preprocess(torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))))
    net.eval().requires_grad_(False)
    folder = tmp_path_factory.mktemp("fidw")
    torch.save({k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}, folder / WEIGHTS)
    return net, folder


def _stats_file(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _adm_arrays(rng, n_images=4):
    def spd(d):
        a = rng.standard_normal((d, 8))
        return a @ a.T + np.eye(d)
    return {"arr_0": rng.integers(0, 256, (n_images, 8, 8, 3), dtype=np.uint8), "mu": rng.standard_normal(2048),
            "sigma": spd(2048), "mu_s": rng.standard_normal(2023), "sigma_s": spd(2023)}


# -- the stats-file path ------------------------------------------------------------------------
def test_fid_through_a_stats_file_is_zero_against_itself_and_the_squared_shift_against_a_shifted_copy(tmp_path, monkeypatch):
    """Features -> the writer's streamed moments -> .npz -> load -> FID. Against the same features: 0; against the
    features shifted by delta (same covariance): ||delta||^2. The file check's pool3 width is lowered to 256 here (a
    2048-d eigendecomposition takes ~15 s on a shared CI core; the path is the same). n > d keeps the covariance full
    rank, so the only error is float64 rounding (~1e-13 of the trace measured; held to 1e-9 of it)."""
    import genlab.eval.ref_stats as rs
    monkeypatch.setitem(rs.DIMS, "inception", 256)
    rng = np.random.default_rng(0)
    f = rng.standard_normal((700, 256)) * rng.uniform(0.2, 2.0, 256) + 3.0  # a large mean: the shifted sums matter
    m = _Moments()
    for i in range(0, len(f), 300):  # uneven batches, as the writer streams them
        m.add(f[i:i + 300])
    mu, sigma = m.result()
    write_reference(tmp_path / "ref.npz", {"mu": mu, "sigma": sigma}, {"test": True})
    ref = load_reference(tmp_path / "ref.npz")
    assert ref.has_stats("inception") and not ref.has_images and not ref.has_stats("inception_spatial")
    mu_r, s_r = ref.stats("inception")
    g_mu, g_s = gaussian_stats(f)
    np.testing.assert_allclose(mu_r, g_mu, rtol=1e-12)
    np.testing.assert_allclose(s_r, g_s, rtol=0, atol=1e-10 * np.abs(g_s).max())  # streamed = two-pass covariance
    tol = 1e-9 * np.trace(g_s)
    assert frechet_from_stats(g_mu, g_s, mu_r, s_r) == pytest.approx(0.0, abs=tol)
    delta = rng.standard_normal(256) * 0.05
    assert frechet_from_stats(*gaussian_stats(f + delta), mu_r, s_r) == pytest.approx(float(delta @ delta), abs=tol)


def test_adm_and_clean_fid_reference_files_both_load(tmp_path):
    rng = np.random.default_rng(0)
    adm = _adm_arrays(rng)
    _stats_file(tmp_path / "adm.npz", adm)
    ref = load_reference(tmp_path / "adm.npz")
    assert ref.has_images and ref.has_stats("inception") and ref.has_stats("inception_spatial")
    np.testing.assert_array_equal(ref.images(), adm["arr_0"])
    for space, (mu, s) in (("inception", ("mu", "sigma")), ("inception_spatial", ("mu_s", "sigma_s"))):
        got = ref.stats(space)
        np.testing.assert_array_equal(got[0], adm[mu])
        np.testing.assert_array_equal(got[1], adm[s])
    # an ADM batch of images only (its statistics computed from arr_0), and clean-fid's compressed mu/sigma (float32)
    _stats_file(tmp_path / "images_only.npz", {"arr_0": adm["arr_0"]})
    only = load_reference(tmp_path / "images_only.npz")
    assert only.has_images and not only.has_stats("inception") and only.can_serve("inception_spatial")
    np.savez_compressed(tmp_path / "cleanfid.npz", mu=adm["mu"].astype(np.float32), sigma=adm["sigma"].astype(np.float32))
    clean = load_reference(tmp_path / "cleanfid.npz")
    assert clean.has_stats("inception") and not clean.has_images and not clean.can_serve("inception_spatial")
    np.testing.assert_array_equal(clean.stats("inception")[1], adm["sigma"].astype(np.float32).astype(np.float64))


class _RunsCode:  # a pickled object whose loading would create a file
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("case", ["not_npz", "pickle", "wrong_keys", "mu_alone", "wrong_dims", "float_images", "missing"])
def test_bad_reference_files_are_one_line_errors_naming_found_and_expected_keys(tmp_path, case):
    p = tmp_path / "ref.npz"
    rng = np.random.default_rng(0)
    expect = {"not_npz": "not a readable .npz", "pickle": "Python objects", "wrong_keys": "holds features float64[4, 16]; expected 'mu' + 'sigma'",
              "mu_alone": "'mu' and 'sigma' come together", "wrong_dims": "expected [2048] and [2048, 2048]",
              "float_images": "arr_0 is float32[2, 8, 8, 3]; expected uint8", "missing": "no such file"}[case]
    if case == "not_npz":
        p.write_text("<html>404</html>")
    elif case == "pickle":
        np.savez(p, mu=np.array([_RunsCode(str(tmp_path / "ran"))], dtype=object), sigma=np.zeros((1, 1)))
    elif case == "wrong_keys":
        np.savez(p, features=rng.standard_normal((4, 16)))
    elif case == "mu_alone":
        np.savez(p, mu=np.zeros(2048))
    elif case == "wrong_dims":  # pytorch-fid's 64-d block statistics are another feature space
        np.savez(p, mu=np.zeros(64), sigma=np.eye(64))
    elif case == "float_images":
        np.savez(p, arr_0=rng.random((2, 8, 8, 3), dtype=np.float32))
    with pytest.raises(GenlabError) as e:
        load_reference(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and expect in msg, msg
    assert not (tmp_path / "ran").exists()  # loading never ran the pickle


def test_reference_writer_refuses_to_overwrite_and_leaves_no_temporary_file(tmp_path):
    out = write_reference(tmp_path / "r.npz", {"mu": np.zeros(2048), "sigma": np.eye(2048)}, {"a": 1})
    before = out.read_bytes()
    with pytest.raises(GenlabError, match="exists; genlab never overwrites"):
        write_reference(out, {"mu": np.ones(2048), "sigma": np.eye(2048)}, {})
    with pytest.raises(GenlabError, match=r"is an \.npz"):
        write_reference(tmp_path / "r.pt", {}, {})
    assert out.read_bytes() == before and sorted(x.name for x in tmp_path.iterdir()) == ["r.npz"]
    with np.load(out, allow_pickle=False) as z:
        assert json.loads(str(z["genlab_meta"])) == {"a": 1}


# -- Inception Score ------------------------------------------------------------------------------
def test_inception_score_closed_forms():
    # uniform p(y|x): every KL is 0, IS = 1
    assert inception_score(np.zeros((40, 1008)), 10) == (pytest.approx(1.0, abs=1e-12), pytest.approx(0.0, abs=1e-12))
    # confident one-hot over K classes, balanced in every split: KL = log K for each sample, IS = K
    k = 5
    logits = np.zeros((100, 1008))
    logits[np.arange(100), np.arange(100) % k] = 800.0  # exp(-800) underflows to 0: exactly one-hot in float64
    mean, std = inception_score(logits, 10)
    assert mean == pytest.approx(k, rel=1e-12) and std == pytest.approx(0.0, abs=1e-12)


def test_inception_score_matches_the_adm_evaluators_formula():
    """ADM's compute_inception_score (numpy, log of the softmax) on consecutive splits of n // splits: another route
    than the log_softmax / logsumexp of the code, equal to float64 rounding."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((60, 1008)) * 3
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = []
    for i in range(0, 60, 6):
        part = p[i:i + 6]
        scores.append(np.exp(np.mean(np.sum(part * (np.log(part) - np.log(part.mean(0, keepdims=True))), 1))))
    mean, std = inception_score(logits, 10)
    assert (mean, std) == (pytest.approx(np.mean(scores), rel=1e-10), pytest.approx(np.std(scores), rel=1e-8))
    with pytest.raises(ValueError, match="10 splits"):
        inception_score(logits[:5], 10)


# -- the network's outputs ------------------------------------------------------------------------
def test_one_pass_gives_pool3_the_2023_d_spatial_features_and_bias_free_logits(stand_in):
    """spatial = the first 7 channels of Mixed_6d's 1x1 branch (TF mixed_6/conv) in NHWC order, 7x17x17 = 2023;
    logits = pool3 @ fc.weight^T (no bias, as ADM's softmax graph and torch-fidelity's logits_unbiased)."""
    from genlab.eval.inception import SPATIAL_CHANNELS, inception_outputs
    net, _ = stand_in
    seen = {}
    h = net.Mixed_6d.branch1x1.register_forward_hook(lambda m, i, o: seen.setdefault("b1", o.detach()))
    try:
        out = inception_outputs(net, torch.randint(0, 256, (1, 12, 12, 3), dtype=torch.uint8))
    finally:
        h.remove()
    assert SPATIAL_CHANNELS * 17 * 17 == 2023
    assert {k: v.shape for k, v in out.items()} == {"pool3": (1, 2048), "spatial": (1, 2023), "logits": (1, 1008)}
    b1 = seen["b1"]
    assert b1.shape == (1, 192, 17, 17)
    np.testing.assert_array_equal(out["spatial"][0], b1[0, :7].permute(1, 2, 0).reshape(-1).double().numpy())
    assert out["spatial"].std() > 0.1 and out["pool3"].std() > 0.01  # the stand-in's activations did not vanish
    w = net.fc.weight.double().numpy()
    np.testing.assert_allclose(out["logits"], out["pool3"] @ w.T, rtol=1e-5, atol=1e-5 * np.abs(out["logits"]).max())
    assert np.abs(net.fc.bias.numpy()).max() > 0.5  # so including the bias would have failed the line above


def test_uint8_pixels_and_float_model_outputs_of_the_same_pixels_give_identical_features(stand_in):
    """References arrive as uint8 [N, H, W, C], samples as float [N, C, H, W] in [-1, 1]: one preprocessing, so the
    same pixels give bit-identical features. A float batch in [0, 255] or a channels-first uint8 batch is refused."""
    from genlab.data.pixels import to_model
    from genlab.eval.inception import inception_outputs, preprocess
    net, _ = stand_in
    u8 = torch.randint(0, 256, (2, 10, 10, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    x = to_model(u8)
    assert x.shape == (2, 3, 10, 10) and x.min() >= -1 and x.max() <= 1
    a, b = inception_outputs(net, u8), inception_outputs(net, x)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match=r"in \[-1, 1\].*got values in \[0"):
        preprocess(u8.movedim(-1, 1).float())
    with pytest.raises(ValueError, match="1- or 3-channel"):
        preprocess(u8.movedim(-1, 1).contiguous())


# -- the metrics, the CLI and the config -------------------------------------------------------------
def _pixel_outputs(dims):
    """A stand-in for inception_outputs (the 299-px network is too slow for these tests): fixed random projections of
    the pixels, pool3 -> logits through a fixed matrix, as wide as `dims` says."""
    g = np.random.default_rng(7)
    proj = {k: g.standard_normal((64 * 3, d)) / 8 for k, d in dims.items() if k != "logits"}
    w = g.standard_normal((dims["pool3"], 1008))

    def outputs(net, images, batch=100, device=None, which=("pool3", "spatial", "logits")):
        x = np.asarray(images, np.float64)
        x = (np.repeat(x, 3, -1) if x.shape[-1] == 1 else x).reshape(len(x), -1)[:, :64 * 3] / 255.0
        pool = np.tanh(x @ proj["pool3"])
        out = {"pool3": pool, "spatial": np.tanh(x @ proj["spatial"]), "logits": 3 * pool @ w}
        return {k: out[k] for k in which}
    return outputs


@pytest.fixture
def cheap_inception(monkeypatch, tmp_path):
    import genlab.eval.inception as inc
    import genlab.eval.ref_stats as rs
    monkeypatch.setitem(rs.DIMS, "inception", 16)
    monkeypatch.setitem(rs.DIMS, "inception_spatial", 12)
    fn = _pixel_outputs({"pool3": 16, "spatial": 12, "logits": 1008})
    patch_everywhere(monkeypatch, inc, "inception_outputs", fn)
    patch_everywhere(monkeypatch, inc, "load_fid_inception", lambda *a, **k: "net")
    (tmp_path / WEIGHTS).write_bytes(b"")
    return fn


def _ctx(**eval_kw):
    from genlab.config.tree import load_config
    cfg = load_config("digits_flow", [])
    for k, v in eval_kw.items():
        setattr(cfg.eval, k, v)
    return {"eval": cfg.eval, "device": "cpu"}


def test_every_protocol_metric_against_a_reference_file_through_the_registry(cheap_inception, tmp_path, capsys):
    """An ADM-layout file written from 40 real images, scored with those same images as the 'samples': FID and sFID
    0 to float tolerance (the file's streamed statistics against gaussian_stats), precision and recall 1, and the IS
    the metric's own function gives their logits."""
    from genlab.core import progress
    from genlab.data.datasets import load_digits_uint8
    from genlab.eval.metrics import check_metrics, image_metrics
    from genlab.eval.ref_stats import compute_reference
    data = load_digits_uint8()
    idx = np.random.default_rng(0).choice(len(data), 40, replace=False)
    imgs = np.asarray(data.images[idx])
    arrays = compute_reference(imgs, "net", batch=16, n_images=40)
    assert arrays["arr_0"].shape == (40, 8, 8, 3)  # grey stored as RGB, as the ADM evaluator's graph reads it
    ref = write_reference(tmp_path / "adm.npz", arrays, {})
    ctx = _ctx(num_samples=40, metrics="fid,sfid,inception_score,pr_inception", fid_ref=str(ref), fid_weights=str(tmp_path))
    check_metrics(ctx["eval"])
    with progress.enabled(True):
        res = image_metrics(torch.from_numpy(imgs), torch.from_numpy(np.asarray(data.labels[idx])), data, ctx)
    trace = np.trace(gaussian_stats(cheap_inception(None, imgs)["pool3"])[1])
    assert res["fid"] == pytest.approx(0.0, abs=1e-9 * trace) and res["sfid"] == pytest.approx(0.0, abs=1e-9 * trace)
    assert res["fid_floor"] > 0.01 and res["sfid_floor"] > 0.01  # other (train) images are not the reference
    assert res["inception_precision"] == res["inception_recall"] == 1.0
    assert res["inception_score"] == inception_score(cheap_inception(None, imgs)["logits"], 10)[0] > 1
    assert res["inception_score_real"] > 1 and res["fid_reference"].startswith("eval.fid_ref adm.npz")
    line = capsys.readouterr().err
    assert "vs eval.fid_ref adm.npz" in line and "sFID" in line and "IS " in line and "50,000" in line
    # clean-fid statistics (no spatial statistics, no images): sfid and pr_inception are refused before sampling
    np.savez(tmp_path / "clean.npz", mu=arrays["mu"], sigma=arrays["sigma"])
    for metric, wanted in (("sfid", "mu_s, sigma_s"), ("pr_inception", "images (arr_0)")):
        with pytest.raises(GenlabError, match=rf"{metric} needs .*{re.escape(wanted)}.*clean.npz holds mu, sigma") as e:
            check_metrics(_ctx(num_samples=40, metrics=metric, fid_ref=str(tmp_path / "clean.npz"),
                               fid_weights=str(tmp_path))["eval"])
        assert "\n" not in str(e.value)
    fid_only = image_metrics(torch.from_numpy(imgs), torch.from_numpy(np.asarray(data.labels[idx])), data,
                             _ctx(num_samples=40, metrics="fid", fid_ref=str(tmp_path / "clean.npz"), fid_weights=str(tmp_path)))
    assert fid_only["fid"] == pytest.approx(0.0, abs=1e-9 * trace)


def test_protocol_metrics_follow_what_the_reference_file_holds(tmp_path, monkeypatch):
    """`genlab eval RUN eval.fid_ref=FILE` alone scores the protocol's metrics that FILE supports."""
    import genlab.runs.load
    from genlab.cli import main
    from genlab.eval.metrics import protocol_metrics
    _stats_file(tmp_path / "adm.npz", _adm_arrays(np.random.default_rng(0)))
    np.savez(tmp_path / "clean.npz", mu=np.zeros(2048), sigma=np.eye(2048))
    assert protocol_metrics(str(tmp_path / "adm.npz")) == "fid,sfid,inception_score,pr_inception"
    assert protocol_metrics(str(tmp_path / "clean.npz")) == "fid,inception_score"
    seen = []
    monkeypatch.setattr(genlab.runs.load, "evaluate_run", lambda run, overrides=(), device="auto": seen.append(overrides) or {})
    assert main(["eval", "RUN", f"eval.fid_ref={tmp_path / 'clean.npz'}"]) == 0
    assert main(["eval", "RUN", f"eval.fid_ref={tmp_path / 'clean.npz'}", "--metrics", "fid"]) == 0
    assert seen[0][-1] == "eval.metrics=fid,inception_score" and seen[1][-1] == "eval.metrics=fid"


def test_fid_ref_is_read_only_by_the_metrics_that_use_it():
    """An unread eval option is a warning (config_check._soft): eval.fid_ref with the default metrics says so."""
    from genlab.config.check import config_warnings
    from genlab.config.tree import load_config
    assert not any("fid_ref" in w for w in config_warnings(load_config("digits_flow", ["eval.metrics=fid,sfid", "eval.fid_ref=r.npz"])))
    warned = [w for w in config_warnings(load_config("digits_flow", ["eval.fid_ref=r.npz"])) if "eval.fid_ref" in w]
    assert len(warned) == 1 and "pr_inception" in warned[0], warned  # names the metrics that read it


def test_ref_stats_cli_writes_the_adm_layout_once(cheap_inception, tmp_path, capsys):
    from genlab.cli import main
    from genlab.data.datasets import load_digits_uint8
    from genlab.data.formats import write_image_dataset
    d = load_digits_uint8()
    ds = write_image_dataset(tmp_path / "ds", np.asarray(d.images[:30]), np.asarray(d.labels[:30]), d.classes, "test")
    out = tmp_path / "ref.npz"
    argv = ["data", "ref-stats", str(ds), "--out", str(out), "--images", "5", "--batch", "7", "--device", "cpu",
            "--fid-weights", str(tmp_path)]
    assert main(argv) == 0
    ref = load_reference(out)
    assert sorted(ref.headers) == ["arr_0", "genlab_meta", "mu", "mu_s", "sigma", "sigma_s"]
    feats = cheap_inception(None, np.asarray(d.images[:30]))
    for space, key in (("inception", "pool3"), ("inception_spatial", "spatial")):
        mu, sigma = ref.stats(space)
        g_mu, g_s = gaussian_stats(feats[key])
        np.testing.assert_allclose(mu, g_mu, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sigma, g_s, rtol=0, atol=1e-12)
    assert ref.images().shape == (5, 8, 8, 3) and (ref.images()[..., 0] == ref.images()[..., 2]).all()
    capsys.readouterr()
    assert main(argv) == 2 and "exists; genlab never overwrites" in capsys.readouterr().err
    with zipfile.ZipFile(out) as z:
        assert all(n.endswith(".npy") for n in z.namelist())


@pytest.mark.slow
def test_real_vs_real_with_the_stand_in_network_through_ref_stats(stand_in, tmp_path):
    """The whole pipeline with the real network (stand-in weights): `genlab data ref-stats` of one half of a real
    dataset, then FID of the other half against that file is small, and much smaller than of the other half
    brightened or blurred (the kind of shift a wrong resize or dtype causes)."""
    import genlab.eval.ref_stats as rs
    from genlab.cli import main
    from genlab.data.datasets import load_digits_uint8
    from genlab.data.formats import write_image_dataset
    from genlab.eval.inception import inception_outputs
    net, weights = stand_in
    N = 10  # images per half: the 299-px network on a CPU is the cost (4 x N images)
    d = load_digits_uint8()
    perm = np.random.default_rng(0).permutation(len(d))
    a, b = np.asarray(d.images[np.sort(perm[:N])]), np.asarray(d.images[np.sort(perm[N:2 * N])])
    ds = write_image_dataset(tmp_path / "a", a, np.asarray(d.labels[np.sort(perm[:N])]), d.classes, "test")
    assert main(["data", "ref-stats", str(ds), "--out", str(tmp_path / "a.npz"), "--images", "0", "--device", "cpu",
                 "--fid-weights", str(weights)]) == 0
    ref = rs.load_reference(tmp_path / "a.npz").stats("inception")
    bright = np.clip(b.astype(np.int16) + 96, 0, 255).astype(np.uint8)
    pad = np.pad(b.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    blur = np.round(sum(pad[:, i:i + 8, j:j + 8] for i in range(3) for j in range(3)) / 9).astype(np.uint8)
    fid = {name: frechet_from_stats(*gaussian_stats(inception_outputs(net, x, which=("pool3",))["pool3"]), *ref)
           for name, x in (("real", b), ("bright", bright), ("blur", blur))}
    assert fid["real"] > 0 and 3 * fid["real"] < fid["bright"] and 3 * fid["real"] < fid["blur"], fid

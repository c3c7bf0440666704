"""Evaluation metrics: the Fréchet maths against closed forms, precision/recall against brute force,
the FID Inception and LPIPS networks' wiring with random weights (no weights can be downloaded here),
the real-vs-real floor, and eval.metrics in `genlab eval` and periodic eval."""
import json

import numpy as np
import pytest
import torch
from conftest import TINY, patch_everywhere

from genlab.core.errors import GenlabError
from genlab.eval.frechet import frechet_distance, frechet_from_stats, trace_sqrt_product


def _rotation(d, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q


def _spd(d, seed, floor=0.1):
    a = np.random.default_rng(seed).standard_normal((d, d))
    return a @ a.T / d + floor * np.eye(d)


# -- Fréchet distance -------------------------------------------------------------------------
def test_frechet_commuting_covariances_equal_the_eigenvalue_closed_form():
    # S1 = Q D1 Q^T, S2 = Q D2 Q^T commute: d^2 = |mu1-mu2|^2 + sum_i (sqrt(d1_i) - sqrt(d2_i))^2
    q = _rotation(6, 0)
    d1, d2 = np.array([3.0, 1.0, 0.5, 2.0, 0.1, 4.0]), np.array([1.0, 1.0, 2.0, 0.3, 0.1, 9.0])
    mu1, mu2 = np.arange(6.0), np.arange(6.0)[::-1]
    exact = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(d1) - np.sqrt(d2)) ** 2).sum()
    got = frechet_from_stats(mu1, q @ np.diag(d1) @ q.T, mu2, q @ np.diag(d2) @ q.T)
    assert got == pytest.approx(exact, rel=1e-10)


def test_frechet_non_commuting_covariances_match_eigenvalues_of_the_product():
    # Tr (S1 S2)^{1/2} = sum sqrt(eig(S1 S2)): a non-symmetric eigendecomposition, another route than the code's
    s1, s2 = _spd(7, 1), _spd(7, 2)
    assert not np.allclose(s1 @ s2, s2 @ s1)
    ref_tr = np.sqrt(np.linalg.eigvals(s1 @ s2).real).sum()
    assert trace_sqrt_product(s1, s2) == pytest.approx(ref_tr, rel=1e-10)
    mu1, mu2 = np.ones(7), np.zeros(7)
    exact = 7 + np.trace(s1) + np.trace(s2) - 2 * ref_tr
    assert frechet_from_stats(mu1, s1, mu2, s2) == pytest.approx(exact, rel=1e-10)
    # 2x2: Tr sqrt(M) = sqrt(tr M + 2 sqrt(det M)) for M with non-negative eigenvalues
    a, b = np.array([[2.0, 0.7], [0.7, 1.0]]), np.array([[0.5, -0.2], [-0.2, 3.0]])
    m = a @ b
    assert trace_sqrt_product(a, b) == pytest.approx(np.sqrt(np.trace(m) + 2 * np.sqrt(np.linalg.det(m))), rel=1e-12)


def test_frechet_singular_covariances_stay_finite_and_exact():
    # rank-one S1 = v v^T, S2 = w w^T: Tr (S1 S2)^{1/2} = |v.w|
    v, w = np.array([1.0, 2.0, 0.0]), np.array([0.5, -1.0, 3.0])
    exact = v @ v + w @ w - 2 * abs(v @ w)
    # the square roots of singular matrices are conditioned like sqrt(machine eps) ~ 1.5e-8: this pair comes out exact
    # only because its zeros survive the eigensolver; rotated copies (the same d, general position) missed by up to
    # 4.7e-9 relative over 200 rotations, so 1e-7
    for q in (np.eye(3), _rotation(3, 1)):
        qv, qw = q @ v, q @ w
        assert frechet_from_stats(np.zeros(3), np.outer(qv, qv), np.zeros(3), np.outer(qw, qw)) == pytest.approx(exact, rel=1e-7)
    # orthogonal degenerate axes: diag(1, 0) vs diag(0, 1) -> 2
    assert frechet_from_stats(np.zeros(2), np.diag([1.0, 0]), np.zeros(2), np.diag([0, 1.0])) == pytest.approx(2.0, abs=1e-12)
    # fewer samples than dimensions (rank-deficient covariances), one dimension constant
    rng = np.random.default_rng(0)
    f = rng.standard_normal((10, 32))
    f[:, 3] = 1.0
    g = rng.standard_normal((12, 32)) + 0.5
    assert frechet_distance(f, f) == pytest.approx(0.0, abs=1e-9)
    d = frechet_distance(f, g)
    assert np.isfinite(d) and d > 0
    # the square root of a singular product (rank <= 10 of 32) is conditioned like sqrt(machine eps) ~ 1.5e-8 per
    # unit of trace: a fresh clone on another BLAS differed by 1.4e-9 relative, so symmetry is held to 1e-6
    assert d == pytest.approx(frechet_distance(g, f), rel=1e-6)


def test_frechet_sample_estimate_converges_to_the_closed_form():
    rng = np.random.default_rng(0)
    d, n = 4, 200_000
    mu1, mu2 = np.array([0.0, 1.0, -1.0, 0.5]), np.array([1.0, 1.0, 0.0, -0.5])
    s1, s2 = _spd(d, 3, 0.5), _spd(d, 4, 0.5)
    exact = frechet_from_stats(mu1, s1, mu2, s2)
    est = frechet_distance(rng.multivariate_normal(mu1, s1, size=n), rng.multivariate_normal(mu2, s2, size=n))
    assert est == pytest.approx(exact, rel=0.02)


# -- precision / recall -----------------------------------------------------------------------
def _brute_pr(real, fake, k):
    def radii(x):
        return np.array([np.sort([np.linalg.norm(a - b) for j, b in enumerate(x) if j != i])[k - 1] for i, a in enumerate(x)])

    def inside(q, s, r):
        return np.array([any(np.linalg.norm(p - s[i]) <= r[i] for i in range(len(s))) for p in q])
    return inside(fake, real, radii(real)).mean(), inside(real, fake, radii(fake)).mean()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_precision_recall_matches_brute_force(k):
    from genlab.eval.metrics import precision_recall
    rng = np.random.default_rng(k)
    # overlapping clouds, each with a cluster the other lacks: precision and recall strictly inside (0, 1)
    real = np.concatenate([rng.standard_normal((30, 4)), rng.standard_normal((10, 4)) - 4])
    fake = np.concatenate([rng.standard_normal((20, 4)) * 1.2, rng.standard_normal((10, 4)) + 4])
    p, r = precision_recall(real, fake, k=k)
    bp, br = _brute_pr(real, fake, k)
    assert (p, r) == (pytest.approx(bp, abs=1e-12), pytest.approx(br, abs=1e-12))
    assert 0 < p < 1 and 0 < r < 1  # the case is not degenerate


def test_precision_recall_toy_cases():
    from genlab.eval.metrics import precision_recall
    x = np.random.default_rng(0).standard_normal((50, 8))
    assert precision_recall(x, x, k=3) == (1.0, 1.0)
    assert precision_recall(x, x + 100.0, k=3) == (0.0, 0.0)
    # half the generated points are real points, half far away: precision exactly 0.5
    fake = np.concatenate([x[:25], x[:25] + 100.0])
    assert precision_recall(x, fake, k=3)[0] == 0.5
    with pytest.raises(ValueError, match="k=3"):
        precision_recall(x[:3], x[:3], k=3)


# -- FID Inception network --------------------------------------------------------------------
def _expected_inception_keys():
    """Every tensor of the published pt_inception-2015-12-05 file, derived from the architecture: each
    conv layer is BasicConv2d (conv.weight + bn.weight/bias/running_mean/running_var), plus fc. torch-fidelity's
    converter of the same TF graph maps 94 conv layers + fc, i.e. 94 * 5 + 2 = 472 tensors."""
    convs = ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "Conv2d_3b_1x1", "Conv2d_4a_3x3"]
    a = ["branch1x1", "branch5x5_1", "branch5x5_2", "branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3", "branch_pool"]
    b = ["branch3x3", "branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"]
    c = ["branch1x1", "branch7x7_1", "branch7x7_2", "branch7x7_3"] + [f"branch7x7dbl_{i}" for i in range(1, 6)] + ["branch_pool"]
    d = ["branch3x3_1", "branch3x3_2"] + [f"branch7x7x3_{i}" for i in range(1, 5)]
    e = ["branch1x1", "branch3x3_1", "branch3x3_2a", "branch3x3_2b", "branch3x3dbl_1", "branch3x3dbl_2",
         "branch3x3dbl_3a", "branch3x3dbl_3b", "branch_pool"]
    blocks = {"Mixed_5b": a, "Mixed_5c": a, "Mixed_5d": a, "Mixed_6a": b, "Mixed_6b": c, "Mixed_6c": c, "Mixed_6d": c,
              "Mixed_6e": c, "Mixed_7a": d, "Mixed_7b": e, "Mixed_7c": e}
    convs += [f"{blk}.{br}" for blk, brs in blocks.items() for br in brs]
    keys = [f"{m}.{t}" for m in convs for t in ("conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var")]
    return len(convs), keys + ["fc.weight", "fc.bias"]


def test_inception_state_dict_matches_the_published_layout():
    from genlab.eval.inception import FIDInceptionV3
    n_convs, expected = _expected_inception_keys()
    sd = FIDInceptionV3().state_dict()
    tensors = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    assert n_convs == 94 and len(expected) == 472
    assert sorted(tensors) == sorted(expected)
    known = {"Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3), "Conv2d_4a_3x3.conv.weight": (192, 80, 3, 3),
             "Mixed_5b.branch_pool.conv.weight": (32, 192, 1, 1), "Mixed_6b.branch7x7_2.conv.weight": (128, 128, 1, 7),
             "Mixed_6e.branch7x7dbl_5.conv.weight": (192, 192, 1, 7), "Mixed_7a.branch3x3_2.conv.weight": (320, 192, 3, 3),
             "Mixed_7b.branch3x3dbl_1.conv.weight": (448, 1280, 1, 1), "Mixed_7c.branch_pool.conv.weight": (192, 2048, 1, 1),
             "Mixed_7c.branch3x3_2b.bn.running_var": (384,), "fc.weight": (1008, 2048), "fc.bias": (1008,)}
    for k, shape in known.items():
        assert tuple(sd[k].shape) == shape, k


def _random_bn_stats(net, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return net.eval()


def test_inception_pool3_features_and_strict_load_round_trip(tmp_path):
    """Random weights saved as the converter writes them (no BatchNorm step counters), found under the
    published file name in eval.fid_weights, load strictly and give the same 2048-d features."""
    from genlab.eval.inception import FIDInceptionV3, inception_features, load_fid_inception
    torch.manual_seed(0)
    net = _random_bn_stats(FIDInceptionV3())
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "pt_inception-2015-12-05-6726825d.pth")
    loaded = load_fid_inception(str(tmp_path))
    for k, v in state.items():
        assert torch.equal(loaded.state_dict()[k], v), k
    f = inception_features(net, torch.randint(0, 256, (1, 28, 28, 1), dtype=torch.uint8))
    assert f.shape == (1, 2048) and np.isfinite(f).all() and (f >= 0).all() and f.std() > 0  # pool3 of ReLU maps
    x = torch.randn(1, 3, 107, 107)  # the network is fully convolutional up to pool3: a small input checks the load
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), rtol=0, atol=0)


def test_inception_input_grey_to_rgb_resize_and_range():
    from genlab.eval.inception import preprocess
    grey = torch.randint(0, 256, (3, 28, 28, 1), dtype=torch.uint8)
    x = preprocess(grey)
    assert x.shape == (3, 3, 299, 299)
    torch.testing.assert_close(x, preprocess(grey.expand(-1, -1, -1, 3)), rtol=0, atol=0)  # the same kernel on the same values
    # white is 1 up to rounding: the bilinear weights (1 - f, f) are rounded float32, their sums miss 1 by an ulp or
    # two per pass and 2x - 1 doubles that (2 eps measured with one thread, 0 with two): held to 4 eps
    white = preprocess(torch.full((1, 8, 8, 3), 255, dtype=torch.uint8))
    torch.testing.assert_close(white, torch.ones_like(white), rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    assert preprocess(torch.zeros((1, 8, 8, 3), dtype=torch.uint8)).eq(-1).all()
    # bilinear with half-pixel centres (align_corners=False), as pytorch-fid resizes
    ref = torch.nn.functional.interpolate(grey.permute(0, 3, 1, 2).float() / 255, size=(299, 299), mode="bilinear",
                                          align_corners=False) * 2 - 1
    torch.testing.assert_close(x[:, :1], ref)


def test_fid_weights_absent_is_one_line_naming_where_it_looked(monkeypatch, tmp_path):
    from genlab.eval.inception import FID_WEIGHTS_URL, find_fid_weights
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    monkeypatch.setenv("GENLAB_FID_WEIGHTS", str(tmp_path / "env"))
    with pytest.raises(GenlabError) as e:
        find_fid_weights("")
    msg = str(e.value)
    assert "\n" not in msg and "pt_inception-2015-12-05-6726825d.pth" in msg and FID_WEIGHTS_URL in msg
    assert str(tmp_path / "th" / "hub" / "checkpoints") in msg and str(tmp_path / "env") in msg
    with pytest.raises(GenlabError, match="nowhere.pth"):
        find_fid_weights(str(tmp_path / "nowhere.pth"))
    # found in the torch hub cache under torch-fidelity's name too
    (tmp_path / "th" / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "th" / "hub" / "checkpoints" / "weights-inception-2015-12-05-6726825d.pth").write_bytes(b"x")
    assert find_fid_weights("").name == "weights-inception-2015-12-05-6726825d.pth"


def test_fid_weights_of_another_network_are_refused(tmp_path):
    from genlab.eval.inception import load_fid_inception
    torch.save({"fc.weight": torch.zeros(10, 2048)}, tmp_path / "pt_inception-2015-12-05-6726825d.pth")
    with pytest.raises(GenlabError, match="do not fit the FID Inception network"):
        load_fid_inception(str(tmp_path))


# -- LPIPS ------------------------------------------------------------------------------------
def _naive_lpips(model, x, y):
    """The formula in float64: unit-normalise channels, squared difference, channel weights, spatial mean,
    sum over the five layers; features from the same layers run one by one in float64."""
    import copy

    from genlab.eval.lpips import TAPS
    feats = copy.deepcopy(model.features).double().requires_grad_(False)
    shift = np.array([-.030, -.088, -.188]).reshape(1, 3, 1, 1)
    scale = np.array([.458, .448, .450]).reshape(1, 3, 1, 1)

    def taps(z):
        h, out = torch.from_numpy((z.double().numpy() - shift) / scale), []
        for i, layer in enumerate(feats):
            h = layer(h)
            if i in TAPS[model.net]:
                out.append(h.numpy())
        return out
    total = np.zeros(len(x))
    for layer, (fx, fy) in enumerate(zip(taps(x), taps(y))):
        w = getattr(model, f"lin{layer}").model[1].weight.detach().double().numpy().reshape(-1)
        nx = fx / (np.sqrt((fx ** 2).sum(1, keepdims=True)) + 1e-10)
        ny = fy / (np.sqrt((fy ** 2).sum(1, keepdims=True)) + 1e-10)
        total += np.einsum("bchw,c->bhw", (nx - ny) ** 2, w).mean((1, 2))
    return total


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_matches_the_naive_float64_formula(net):
    from genlab.eval.lpips import LPIPS
    torch.manual_seed(0)
    model = LPIPS(net).eval()
    for i in range(5):  # the published linear weights are non-negative
        getattr(model, f"lin{i}").model[1].weight.data.uniform_(0, 1)
    side = 64 if net == "alex" else 32  # VGG keeps a 2x2 map at relu5_3 from 32 px: enough, and cheap on CPU
    x, y = torch.rand(2, 3, side, side) * 2 - 1, torch.rand(2, 3, side, side) * 2 - 1
    with torch.no_grad():
        got = model(x, y).double().numpy()
        assert model(x, x).abs().max() == 0
    np.testing.assert_allclose(got, _naive_lpips(model, x, y), rtol=1e-5)


def test_lpips_keys_follow_torchvision_and_the_lpips_package():
    from genlab.eval.lpips import LPIPS
    alex = LPIPS("alex").state_dict()
    assert {k: tuple(v.shape) for k, v in alex.items() if k.endswith("weight")} == {
        "features.0.weight": (64, 3, 11, 11), "features.3.weight": (192, 64, 5, 5), "features.6.weight": (384, 192, 3, 3),
        "features.8.weight": (256, 384, 3, 3), "features.10.weight": (256, 256, 3, 3),
        "lin0.model.1.weight": (1, 64, 1, 1), "lin1.model.1.weight": (1, 192, 1, 1), "lin2.model.1.weight": (1, 384, 1, 1),
        "lin3.model.1.weight": (1, 256, 1, 1), "lin4.model.1.weight": (1, 256, 1, 1)}
    vgg = LPIPS("vgg").state_dict()
    convs = sorted(int(k.split(".")[1]) for k in vgg if k.startswith("features.") and k.endswith("weight"))
    assert convs == [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]  # torchvision vgg16 `features` indices
    assert tuple(vgg["features.28.weight"].shape) == (512, 512, 3, 3) and tuple(vgg["lin4.model.1.weight"].shape) == (1, 512, 1, 1)


def test_lpips_loads_torchvision_backbone_and_lpips_linear_files(tmp_path, monkeypatch):
    from genlab.eval.lpips import LPIPS, load_lpips
    torch.manual_seed(1)
    src = LPIPS("alex")
    backbone = {f"features.{k}": v for k, v in src.features.state_dict().items()}
    backbone.update({"classifier.1.weight": torch.zeros(4096, 9216), "classifier.1.bias": torch.zeros(4096)})
    torch.save(backbone, tmp_path / "alexnet-owt-7be5be79.pth")
    torch.save({f"lin{i}.model.1.weight": getattr(src, f"lin{i}").model[1].weight.detach().clone() for i in range(5)},
               tmp_path / "alex.pth")
    model = load_lpips("alex", str(tmp_path))
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    monkeypatch.setenv("GENLAB_LPIPS_WEIGHTS", str(tmp_path))  # the environment variable finds them too
    assert load_lpips("alex", "") is not None
    (tmp_path / "alex.pth").unlink()
    with pytest.raises(GenlabError, match=r"alex\.pth.*PerceptualSimilarity"):
        load_lpips("alex", str(tmp_path))


def test_lpips_small_grey_images_become_64px_rgb_and_pairs_share_a_class():
    from genlab.eval.lpips import same_class_pairs, to_lpips_input
    x = to_lpips_input(torch.randint(0, 256, (2, 8, 8, 1), dtype=torch.uint8))
    assert x.shape == (2, 3, 64, 64) and x.min() >= -1 and x.max() <= 1
    labels = np.arange(50) % 10
    i, j = same_class_pairs(labels, 40)
    assert len(i) == 40 and (labels[i] == labels[j]).all() and (i != j).all()


# -- the real-vs-real floor and the metrics in eval ------------------------------------------
def _ids_dataset(n, size=8):
    """Images whose first pixel row encodes their index, so disjointness can be checked."""
    from genlab.data.formats import ImageData
    imgs = np.zeros((n, size, size, 1), np.uint8)
    imgs[:, 0, 0, 0], imgs[:, 0, 1, 0] = np.arange(n) % 256, np.arange(n) // 256
    return ImageData(images=imgs, labels=np.arange(n) % 10, classes=[str(c) for c in range(10)], meta={})


def _ids(images):
    return set((images[:, 0, 0, 0].astype(int) + 256 * images[:, 0, 1, 0].astype(int)).tolist())


def test_real_split_without_val_path_is_two_disjoint_halves():
    from genlab.eval.real_split import real_split
    data = _ids_dataset(301)
    s = real_split(data, "", n=100, ref_samples=10_000)
    assert len(s.held_out) == 150 and len(s.train) == 100 and not (_ids(s.held_out) & _ids(s.train))
    assert "half of the training images" in s.source
    s = real_split(data, "", n=400, ref_samples=50)  # more samples than the other half holds: all of it
    assert len(s.held_out) == 50 and len(s.train) == 151 and not (_ids(s.held_out) & _ids(s.train))


def test_real_split_with_val_path_uses_the_test_folder(tmp_path):
    from genlab.data.formats import write_image_dataset
    from genlab.eval.real_split import real_split
    test = _ids_dataset(40)
    test.images[:, 1, 1, 0] = 255  # marks the test images
    write_image_dataset(tmp_path / "test", test.images, test.labels, test.classes, source="test")
    s = real_split(_ids_dataset(100), str(tmp_path / "test"), n=30, ref_samples=25)
    assert len(s.held_out) == 25 and (s.held_out[:, 1, 1, 0] == 255).all()
    assert len(s.train) == 30 and (s.train[:, 1, 1, 0] == 0).all() and "eval.val_path" in s.source
    write_image_dataset(tmp_path / "big", np.zeros((5, 16, 16, 1), np.uint8), np.zeros(5), ["0"], source="x")
    with pytest.raises(GenlabError, match="eval.val_path images are"):
        real_split(_ids_dataset(100), str(tmp_path / "big"), n=30, ref_samples=25)


def _ctx(**eval_overrides):
    from genlab.config.tree import load_config
    cfg = load_config("digits_flow", ["eval.classifier_epochs=5"] + [f"eval.{k}={v}" for k, v in eval_overrides.items()])
    return {"eval": cfg.eval, "device": torch.device("cpu")}


class _NearestMean(torch.nn.Module):
    """A closed-form stand-in for the trained classifier (training one costs a minute on a loaded CPU):
    features are the pixels, logits the negative squared distance to each class mean."""

    def __init__(self, data):
        super().__init__()
        from genlab.data.pixels import to_model
        x = to_model(torch.from_numpy(np.asarray(data.images))).flatten(1)
        y = torch.from_numpy(np.asarray(data.labels))
        self.register_buffer("means", torch.stack([x[y == c].mean(0) for c in range(10)]))

    def forward(self, x, return_features=False):
        f = x.flatten(1)
        logits = -torch.cdist(f, self.means) ** 2
        return (logits, f) if return_features else logits


def test_real_images_score_near_the_floor_and_noise_far_above_it(capsys, monkeypatch):
    import genlab.eval.classifier as clf
    from genlab.core import progress
    from genlab.data.datasets import load_digits_uint8
    from genlab.eval.metrics import image_metrics
    data = load_digits_uint8()
    patch_everywhere(monkeypatch, clf, "get_classifier", lambda data, device="cpu", epochs=0: (_NearestMean(data), 0.9))
    idx = np.random.default_rng(5).choice(len(data), 100, replace=False)
    real = torch.from_numpy(np.asarray(data.images[idx]))
    labels = torch.from_numpy(np.asarray(data.labels[idx]))
    with progress.enabled(True):
        res = image_metrics(real, labels, data, _ctx(num_samples=100))
    line = capsys.readouterr().err
    assert f"feature FD {res['feature_fd']:.4g} (real-vs-real floor {res['feature_fd_floor']:.4g})" in line
    assert res["sample_accuracy"] > 0.8 and res["eval_samples"] == res["floor_samples"] == 100
    assert res["feature_fd"] < 3 * res["feature_fd_floor"] and res["precision"] > 0.6 and res["recall"] > 0.6
    noise = torch.randint(0, 256, real.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    bad = image_metrics(noise, labels, data, _ctx(num_samples=100))
    assert bad["feature_fd"] > 10 * bad["feature_fd_floor"] and bad["precision"] < 0.1
    assert bad["feature_fd_floor"] == res["feature_fd_floor"]  # the floor does not depend on the samples


def test_fid_and_lpips_run_through_the_metric_registry(tmp_path, monkeypatch):
    """The fid/lpips entries with random-weight networks: keys, floors and the real-vs-real references.
    Inception at 299 px is too slow for a CPU test, so its feature extractor is replaced by a pixel mean
    pool (the network itself is tested above)."""
    import genlab.eval.inception as inc
    from genlab.data.datasets import load_digits_uint8
    from genlab.eval.lpips import LPIPS
    from genlab.eval.metrics import image_metrics
    torch.save({k: v for k, v in LPIPS("alex").state_dict().items() if k.startswith("features.")},
               tmp_path / "alexnet-owt-7be5be79.pth")
    torch.save({k: v.abs() for k, v in LPIPS("alex").state_dict().items() if k.startswith("lin")}, tmp_path / "alex.pth")
    (tmp_path / "pt_inception-2015-12-05-6726825d.pth").write_bytes(b"")
    patch_everywhere(monkeypatch, inc, "load_fid_inception", lambda *a, **k: "net")
    patch_everywhere(monkeypatch, inc, "inception_outputs",
                        lambda net, imgs, **k: {"pool3": np.asarray(imgs, np.float64).reshape(len(imgs), -1)[:, ::4]})
    data = load_digits_uint8()
    idx = np.random.default_rng(0).choice(len(data), 60, replace=False)
    res = image_metrics(torch.from_numpy(data.images[idx]), torch.from_numpy(data.labels[idx]), data,
                        _ctx(num_samples=60, metrics="fid,lpips", fid_weights=str(tmp_path), lpips_weights=str(tmp_path),
                             lpips_pairs=20))
    assert set(res) >= {"fid", "fid_floor", "lpips_diversity", "lpips_diversity_real"} and "sample_accuracy" not in res
    assert 0 < res["fid"] < 3 * res["fid_floor"] and res["lpips_diversity"] > 0 and res["lpips_diversity_real"] > 0


def test_unknown_metric_lists_the_valid_choices():
    from genlab.config.tree import load_config
    with pytest.raises(GenlabError, match="unknown eval.metrics entry 'fidd'.*did you mean 'fid'.*accuracy, fd, fid, inception_score, lpips, pr, "
                                             "pr_inception, sfid"):
        load_config("digits_flow", ["eval.metrics=accuracy,fidd"])
    with pytest.raises(GenlabError, match="eval.metrics is empty"):
        load_config("digits_flow", ["eval.metrics= , "])


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A 6-step run evaluated at steps 3 and 6, with the closed-form classifier stand-in throughout."""
    import genlab.eval.classifier as clf
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("evalrun")
    cfg = load_config("digits_flow", TINY + [f"train.out_dir={out}", "train.name=r", "train.steps=6", "log.eval_every=3",
                                             "eval.num_samples=30", "eval.sample_steps=2"])
    with pytest.MonkeyPatch.context() as mp:
        patch_everywhere(mp, clf, "get_classifier", lambda data, device="cpu", epochs=0: (_NearestMean(data).to(device), 0.9))
        summary = Trainer(cfg).fit()
    return summary, out / "r"  # the stand-in is undone here, not at the module's end


@pytest.mark.slow
def test_periodic_and_final_eval_log_every_distance_with_its_floor(evaluated_run):
    summary, run = evaluated_run
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if "eval/feature_fd" in r]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert {"eval/feature_fd_floor", "eval/precision", "eval/recall", "eval/sample_accuracy"} <= set(r)
    saved = json.loads((run / "summary.json").read_text())
    assert saved["feature_fd_floor"] == summary["feature_fd_floor"] > 0 and "precision_floor" in saved


def test_cli_eval_metrics_flag(evaluated_run, capsys):
    from genlab.cli import main
    _, run = evaluated_run
    assert main(["eval", str(run), "eval.num_samples=20", "eval.sample_steps=2", "--metrics", "fd,pr"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert {"feature_fd", "feature_fd_floor", "precision", "recall"} <= set(res) and "sample_accuracy" not in res
    assert "real-vs-real floor" in out.err
    assert main(["eval", str(run), "--metrics", "fid"]) == 2
    assert "pt_inception-2015-12-05-6726825d.pth" in capsys.readouterr().err


def test_feature_classifier_trains_in_fp32_under_the_trainers_autocast():
    """The trainer's final evaluation runs under bf16 autocast; the classifier must not train in bf16 (it stayed at
    chance accuracy on MNIST and poisoned the cache). Same seed and data: identical weights inside autocast or not."""
    from genlab.eval.classifier import train_classifier
    g = np.random.default_rng(0)
    imgs = g.integers(0, 256, (300, 1, 28, 28), dtype=np.uint8)
    labels = g.integers(0, 10, 300)
    plain, _ = train_classifier(imgs, labels, 10, epochs=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under, _ = train_classifier(imgs, labels, 10, epochs=2)
    for (k, a), b in zip(plain.state_dict().items(), under.state_dict().values()):
        assert a.dtype == torch.float32 and torch.equal(a, b), k


def test_a_cached_classifier_that_never_learned_is_retrained(tmp_path, monkeypatch):
    from genlab.eval import classifier as C
    monkeypatch.setenv("GENLAB_CACHE", str(tmp_path))
    g = np.random.default_rng(1)

    class Data:
        images = g.integers(0, 256, (200, 1, 28, 28), dtype=np.uint8)
        labels = g.integers(0, 10, 200)
        spec = {"channels": 1, "num_classes": 10}
        meta = {"sha256": "ab" * 32}
    path = tmp_path / "classifiers" / f"{'ab' * 8}-e2.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": C.SmallConvNet(1, 10).state_dict(), "val_acc": 0.1}, path)  # at chance: a poisoned entry
    calls = []
    monkeypatch.setattr(C, "train_classifier", lambda *a, **k: calls.append(1) or (C.SmallConvNet(1, 10), 0.9))
    _, acc = C.get_classifier(Data(), epochs=2)
    assert calls == [1] and acc == 0.9
    assert torch.load(path, weights_only=True)["val_acc"] == 0.9


def test_trace_sqrt_product_cholesky_and_eigh_paths_agree_with_the_commuting_closed_form():
    """Tr (S1 S2)^{1/2}: full-rank S1 takes the Cholesky path, singular S1 the eigh path. For covariances sharing
    eigenvectors (S1 = U diag(a) U^T, S2 = U diag(b) U^T) the closed form is sum sqrt(a_i b_i). Full rank: float64
    rounding, 1e-10 relative. Singular: each zero eigenvalue comes out as ~eps * |S| and its square root as
    sqrt(eps * |S| * |b|) ~ 4e-8, so 40 of them allow 40 * sqrt(eps * 9 * 3) absolute."""
    import numpy as np

    from genlab.eval.frechet import trace_sqrt_product
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((40, 40)))
    b = rng.uniform(0.1, 3.0, 40)
    for a in (rng.uniform(0.1, 3.0, 40), np.r_[rng.uniform(0.1, 3.0, 25), np.zeros(15)]):  # full rank, then rank 25
        s1, s2 = (u * a) @ u.T, (u * b) @ u.T
        if a.min() == 0:
            with pytest.raises(np.linalg.LinAlgError):
                np.linalg.cholesky(s1)  # the case really is singular to LAPACK, so the fallback path runs
        tol = 1e-10 * np.sqrt(a * b).sum() if a.min() > 0 else 40 * np.sqrt(np.finfo(float).eps * 27)
        assert abs(trace_sqrt_product(s1, s2) - np.sqrt(a * b).sum()) < tol


def test_the_feature_classifier_is_cached_per_dataset_and_reads_a_memmap_without_warning(tmp_path, monkeypatch):
    """The first evaluation of a dataset trains the classifier (minutes on MNIST on a CPU); later ones load it, keyed by
    the data's checksum and the epochs. A prepared dataset is a read-only memmap: no tensor may wrap it uncopied
    (torch's "The given NumPy array is not writable" warning, once per process, so checked at the call)."""
    from genlab.config.tree import load_config
    from genlab.data.datasets import build_dataset
    from genlab.data.formats import read_image_dataset, write_image_dataset
    from genlab.eval import classifier as C
    monkeypatch.setenv("GENLAB_CACHE", str(tmp_path / "cache"))
    digits = build_dataset(load_config(None).data)
    write_image_dataset(tmp_path / "ds", np.asarray(digits.images), np.asarray(digits.labels), digits.classes, "test")
    data = read_image_dataset(tmp_path / "ds")
    assert not data.images.flags.writeable
    real = torch.from_numpy

    def writable_only(a):
        assert a.flags.writeable, "torch.from_numpy of a read-only array"
        return real(a)
    monkeypatch.setattr(torch, "from_numpy", writable_only)
    monkeypatch.setattr(C, "_learned", lambda k: 0.0)  # cache whatever one epoch learns
    net, acc = C.get_classifier(data, epochs=1)
    entry = tmp_path / "cache" / "classifiers" / f"{data.meta['sha256'][:16]}-e1.pt"
    assert sorted((tmp_path / "cache" / "classifiers").iterdir()) == [entry]
    monkeypatch.setattr(C, "train_classifier", lambda *a, **k: pytest.fail("trained again, with a cached entry"))
    again, acc2 = C.get_classifier(read_image_dataset(tmp_path / "ds"), epochs=1)
    assert acc2 == acc and all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))

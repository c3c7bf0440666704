"""Every combination of the registries' axes trains, samples and evaluates, or is refused before any work (issue 52).

The cases are generated from the registries, not listed by hand: every method crossed with every sampler, every
backbone and every dataset kind (pairwise with the method), each on the method's own tiny CPU config: the default
preset switched to the method and to the model and data of its shipped preset (folders made here from the digits),
with a teacher where the method reads method.teacher. The world and language methods are crossed with their own axes
as well: every entry of the registries their own method keys select (the world objectives) and every dataset of their
kinds. A case passes when `genlab train` trains, previews and evaluates and `genlab sample` draws from the run, or when
`genlab train` exits 2 with one stderr line and leaves no run folder. Unmarked: every one-component switch on the
default preset; the crosses are marked slow.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomllib
from conftest import TINY, cli_in_process

from genlab.config.check import read_keys
from genlab.config.fields import dotted_of, meta_of
from genlab.config.keys import declared_keys
from genlab.config.tree import CONFIG_DIR, Config, apply_dict, apply_overrides, load_config, load_toml, resolve_preset_path
from genlab.core.errors import GenlabError
from genlab.core.registry import REGISTRIES
from genlab.data.datasets import dataset_registry
from genlab.families.models import model_registry
from genlab.sampling.samplers import sampler_registry
from genlab.families.base import method_registry

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)

DEFAULT = "digits_flow"
SWITCHED = ("method.name", "method.sampler", "model.name", "data.name")  # the axes a user switches on the command line
# cheap settings for every family, each given where the case's config reads its key (one that no chosen component
# reads would be refused as an unused option)
# (TINY's warm-up of 5 steps cannot end within 2: `genlab train` would refuse every case before it ran)
SMALL = [*(o for o in TINY if not o.startswith("optim.warmup_steps=")), "optim.warmup_steps=1", "train.steps=2", "log.ckpt_every=0",
         "data.image_size=8", "data.channels=1", "data.num_classes=10", "data.size=64", "data.vocab_size=16",
         "data.seq_len=32", "method.sample_len=24", "eval.nelbo_reps=1",
         "data.context_frames=2", "data.horizon=3", "data.heldout=0.34", "eval.world_rollouts=4", "eval.world_horizons=4",
         "model.channel_mult=1,2", "model.latent_channels=2"]
PRESETS = {p.stem: tomllib.loads(p.read_text()) for p in sorted(CONFIG_DIR.glob("*.toml"))}
OUTCOMES: dict[tuple, str] = {}  # case -> "ran" | "refused: <the line>", shared by the tests that meet one case


def key(override: str) -> str:
    return override.split("=", 1)[0]


def component(preset: str, sec: str) -> str:
    """The entry a shipped preset picks for `sec`.name (the config default where it names none)."""
    return PRESETS[preset].get(sec, {}).get("name") or getattr(getattr(Config(), sec), "name")


def entries(selector: str) -> list[str]:
    """Every entry of the registry a selector key names."""
    return REGISTRIES[meta_of(declared_keys()[selector][0].field)["registry"]].names()


def reads_teacher(method: str) -> bool:
    spec = method_registry.spec(method)
    return "method.teacher" in dotted_of(spec.keys) or "method.teacher" in spec.reads


def with_data(case: tuple, name: str) -> tuple:
    """The case on dataset `name` (a folder made by the test where it reads one)."""
    kept = tuple(c for c in case if key(c) not in ("data.name", "data.path"))
    if name == component(DEFAULT, "data"):
        return kept
    return kept + (f"data.name={name}",) + ((f"data.path={{folder:{name}}}",) if dataset_registry.spec(name).needs_path else ())


def with_model(case: tuple, name: str) -> tuple:
    kept = tuple(c for c in case if key(c) != "model.name")
    return kept if name == component(DEFAULT, "model") else kept + (f"model.name={name}",)


def method_base(method: str) -> tuple:
    """The method on the default preset with the model and data of its shipped preset (the default preset first, then
    one whose data needs no folder) and a teacher where it reads method.teacher."""
    own = sorted((p for p, t in PRESETS.items() if t.get("method", {}).get("name") == method),
                 key=lambda p: (p != DEFAULT, dataset_registry.spec(component(p, "data")).needs_path, p))
    source = own[0] if own else DEFAULT
    case = with_data(with_model((f"method.name={method}",), component(source, "model")), component(source, "data"))
    return case + (("method.teacher={teacher}",) if reads_teacher(method) else ())


def kind_dataset(kind: str) -> str:
    """The dataset standing for a kind: the first needing no folder, by name."""
    return min((n for n, s in dataset_registry.specs() if s.kind == kind),
               key=lambda n: (dataset_registry.spec(n).needs_path, n))


def family_axes(method: str) -> list[tuple[str, tuple]]:
    """The own axes of a method outside the image family: every entry of the registries its other method keys select,
    every dataset of its kinds."""
    base, spec = method_base(method), method_registry.spec(method)
    own = [k for k in list(dotted_of(spec.keys)) + list(spec.reads)
           if k not in SWITCHED and meta_of(declared_keys()[k][0].field).get("registry")]
    cases = [(f"{k.split('.')[1]}={n}", base + (f"{k}={n}",)) for k in own for n in entries(k)]
    kinds = method_registry.get(method).data_kinds
    return cases + [(f"data={n}", with_data(base, n)) for n, s in dataset_registry.specs() if s.kind in kinds]


def crosses() -> list:
    out = []
    kinds = sorted({s.kind for _, s in dataset_registry.specs()})
    for m in method_registry.names():
        base = method_base(m)
        out += [(f"{m}-sampler={s}", base + (f"method.sampler={s}",)) for s in sampler_registry.names()]
        out += [(f"{m}-model={b}", with_model(base, b)) for b in model_registry.names()]
        out += [(f"{m}-kind={k}", with_data(base, kind_dataset(k))) for k in kinds]
        if not {"image", "latent"} & set(method_registry.get(m).data_kinds):
            out += [(f"{m}-{axis}", case) for axis, case in family_axes(m)]
    return [pytest.param(case, id=name) for name, case in out]


# -- what the cases need: a teacher run, data folders ---------------------------------------------------------------
def _images(root: Path, needs) -> Path:
    from genlab.data.datasets import load_digits_uint8
    from genlab.data.formats import write_image_dataset
    d = load_digits_uint8()
    return write_image_dataset(root / "images", d.images, d.labels, d.classes, "digits")


def _latents(root: Path, needs) -> Path:
    from genlab.data.encode import encode_dataset
    return encode_dataset(needs.folder("images"), "unshuffle:2", root / "latents", batch_size=256, device="cpu")


def _episodes(root: Path, needs) -> Path:
    from genlab.data.episodes import write_episodes
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (60, 16, 16, 3), dtype=np.uint8)
    return write_episodes(root / "episodes", frames, rng.integers(0, 3, 60), starts=[0, 20, 40], meta={"num_actions": 3})


def _tokens(root: Path, needs) -> Path:
    from genlab.data.text import prepare_text
    (root / "corpus.txt").write_text("It was the best of times, it was the worst of times.\n" * 40)
    return prepare_text(root / "corpus.txt", root / "tokens")


FOLDERS = {"images": _images, "latents": _latents, "episodes": _episodes, "tokens": _tokens,
           "pairs": lambda root, needs: Path(needs.request.getfixturevalue("pairs_dir"))}


class Needs:
    """Placeholders of the cases made real on first use: {teacher} (a tiny flow run of the case's backbone: conftest's
    for the default one) and {folder:NAME}."""

    def __init__(self, request, root: Path):
        self.request, self.root, self.made, self.teachers = request, root, {}, {}

    def teacher(self, model: str) -> str:
        if model not in self.teachers:
            from conftest import tiny_config

            from genlab.training.trainer import Trainer
            try:
                cfg = tiny_config(self.root, f"train.name=teacher-{model}", f"model.name={model}", "train.steps=30",
                                  "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0")
            except GenlabError:  # no flow model: the case is refused for its backbone, whichever teacher it names
                model = component(DEFAULT, "model")
            if model == component(DEFAULT, "model"):
                return self.request.getfixturevalue("flow_teacher")
            Trainer(cfg).fit()
            self.teachers[model] = str(self.root / f"teacher-{model}")
        return self.teachers[model]

    def folder(self, name: str) -> str:
        if name not in self.made:
            if name not in FOLDERS:
                pytest.fail(f"no test folder for data.name={name}: add a builder to FOLDERS")
            self.made[name] = str(FOLDERS[name](self.root, self))
        return self.made[name]

    def resolve(self, case: tuple) -> list[str]:
        out = []
        model = next((c.split("=")[1] for c in case if key(c) == "model.name"), component(DEFAULT, "model"))
        for c in case:
            if "{teacher}" in c:
                c = c.replace("{teacher}", self.teacher(model))
            if "{folder:" in c:
                k, v = c.split("=", 1)
                c = f"{k}={self.folder(v[len('{folder:'):-1])}"
            out.append(c)
        return out


@pytest.fixture(scope="session")
def needs(request, tmp_path_factory):
    return Needs(request, tmp_path_factory.mktemp("combinations"))


# -- one case -------------------------------------------------------------------------------------------------------
def small(case: list[str]) -> list[str]:
    """The SMALL settings the case's config reads and does not set itself (read before validation, which may need one
    of them: synthetic tokens' vocabulary); none where the case's own keys or values are unknown."""
    try:
        cfg = apply_overrides(apply_dict(Config(), load_toml(resolve_preset_path(DEFAULT))), case)
        read = read_keys(cfg)
    except GenlabError:
        return []
    given = {key(c) for c in case}
    return [s for s in SMALL if key(s) in read and key(s) not in given]


def without_unread(case: tuple) -> tuple:
    """The case less the keys its config accepts without reading them (a sampling key of another method: a warning
    where it is not the default): the same run as without them."""
    try:
        read = read_keys(load_config(DEFAULT, [*case, *small(list(case))]))
    except GenlabError:
        return case
    return tuple(c for c in case if key(c) in read)


def outcome(case: tuple, needs, capfd, tmp_path) -> str:
    """Run `genlab train` on the case (and `genlab sample` on its run); check whichever contract it meets."""
    same = without_unread(case)
    if same != case:
        print(" ".join(case), "-> as", " ".join(same), "(the rest is not read)")
    seen = tuple(sorted(same))  # overrides of distinct keys: their order is no other case
    if seen not in OUTCOMES:
        argv = needs.resolve(same)
        out = tmp_path / "runs"
        r = cli_in_process(capfd, "train", DEFAULT, *argv, *small(argv), f"train.out_dir={out}", "train.name=run")
        OUTCOMES[seen] = refused(r, out) if r.returncode == 2 else ran(r, out / "run", capfd)
    print(" ".join(same), "->", OUTCOMES[seen])
    return OUTCOMES[seen]


def refused(r, out: Path) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genlab: error:"), r.stderr[-3000:]
    assert not out.exists() or not any(out.iterdir()), f"a refused run left {list(out.iterdir())}"
    return "refused: " + lines[0].removeprefix("genlab: error: ")


def ran(r, run: Path, capfd) -> str:
    """Trained, previewed, evaluated, and `genlab sample` draws from the run; or, for a method that trains no generator
    (an encoder), trained and `genlab sample` says so in one line."""
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished", summary
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = any(k.startswith("eval/") for rec in records for k in rec)
    s = cli_in_process(capfd, "sample", run, "--n", "4")
    if s.returncode == 2 and "trains no generator" in s.stderr:
        assert s.stderr.count("\n") == 1 and not summary.get("samples") and not evaluated, s.stderr
        return "ran (trains no generator: nothing to sample or evaluate)"
    assert s.returncode == 0, s.stderr[-3000:]
    assert summary.get("samples") and Path(summary["samples"]).exists(), "no preview"
    assert evaluated, "no evaluation"
    return "ran"


# -- the tests ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [pytest.param((f"{k}={n}",), id=f"{k}={n}") for k in SWITCHED for n in entries(k)])
def test_a_one_component_switch_on_the_default_preset_runs_or_is_refused_before_work(case, needs, capfd, tmp_path):
    outcome(case, needs, capfd, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", crosses())
def test_every_method_crossed_with_every_axis_runs_or_is_refused_before_work(case, needs, capfd, tmp_path):
    outcome(case, needs, capfd, tmp_path)


def test_switching_the_method_brings_its_sampler_and_an_explicit_one_that_cannot_work_is_refused(capfd, tmp_path):
    assert load_config(DEFAULT, ["method.name=shortcut"]).method.sampler == "flow_map"  # the preset's heun cannot feed d
    assert load_config(DEFAULT, {"method.name": "meanflow"}).method.sampler == "flow_map"  # the API's typed overrides
    assert load_config(DEFAULT, []).method.sampler == "heun"  # the default run is untouched
    assert load_config("text_ar", ["method.name=mdlm"]).model.causal is False  # the attention mdlm needs
    from genlab.config.tree import _switched_at  # naming the entry a preset chose is no switch: its values stay
    assert _switched_at([{"method.name": "flow"}, {"method.name": "flow"}], "method.name") == 0
    assert _switched_at([{"method.name": "flow"}, {"method.name": "shortcut"}], "method.name") == 1
    r = cli_in_process(capfd, "train", DEFAULT, "method.name=shortcut", "method.sampler=heun", f"train.out_dir={tmp_path}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "samplers for it: flow_map" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())

"""Components declare themselves: a method added from one file at run time trains, samples through `genlab
sample`, has its config key validated and documented, and conditions the model on a new input, with no other
edit; and the declarations leave no key unread and no component without its typed spec."""
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TINY, unregister

from genlab.cli import main
from genlab.config.tree import load_config
from genlab.core.errors import GenlabError
from genlab.core.registry import load_plugin
from genlab.families.base import method_registry

PLUGIN = REPO / "tests" / "plugins" / "toy_conditioned_flow.py"


@pytest.fixture(scope="module")
def toy():
    load_plugin(str(PLUGIN))
    yield "toy_conditioned"
    unregister(method_registry, "toy_conditioned")


def test_a_plugin_key_is_range_checked_and_refused_with_another_method(toy):
    cfg = load_config(None, [f"method.name={toy}", "method.toy_strength=0.25"])
    assert cfg.method.toy_strength == 0.25
    with pytest.raises(GenlabError, match=r"method.toy_strength must be <= 1"):
        load_config(None, [f"method.name={toy}", "method.toy_strength=2"])
    with pytest.raises(GenlabError, match=r"method.toy_strength is not read by method 'flow'.*toy_conditioned"):
        load_config(None, ["method.toy_strength=0.25"])


def test_a_plugin_key_is_documented_by_genlab_config(toy, capsys):
    assert main(["config", f"method.name={toy}"]) == 0
    out = capsys.readouterr().out
    assert "# toy: the strength every sample is conditioned on at sampling time  [>= 0, <= 1]" in out
    assert "toy_strength = 0.5" in out


def test_a_plugin_method_trains_samples_and_conditions_the_model(toy, tmp_path, capsys):
    run = tmp_path / "toy"
    assert main(["train", "digits_flow", *TINY, f"method.name={toy}", "optim.warmup_steps=1", "train.steps=3", "eval.num_samples=0",
                 f"train.out_dir={tmp_path}", "train.name=toy"]) == 0
    assert main(["sample", str(run), "--n", "10", "--steps", "2", "--out", str(tmp_path / "grid.png")]) == 0
    assert (tmp_path / "grid.png").stat().st_size > 0
    from genlab.runs.load import load_run
    _, model, method, _, _ = load_run(run)
    assert "cond_embed.embed.strength.mlp.0.weight" in model.state_dict()
    x, t, y = torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([1, 2])
    with torch.no_grad():
        a, b = model(x, t, y, strength=torch.zeros(2)), model(x, t, y, strength=torch.ones(2))
    assert not torch.allclose(a, b)  # the new input reaches the output
    with pytest.raises(GenlabError, match="missing"):
        model(x, t, y)
    g = torch.Generator().manual_seed(0)
    weak = method.sample(model, y, steps=2, generator=g, conditions={"strength": torch.zeros(2)})
    g = torch.Generator().manual_seed(0)
    strong = method.sample(model, y, steps=2, generator=g, conditions={"strength": torch.ones(2)})
    assert not torch.allclose(weak, strong)  # samplers pass the condition through (extra_args)


def test_genlab_plugins_loads_a_component_file_in_a_fresh_process(tmp_path):
    env = {**os.environ, "GENLAB_PLUGINS": str(PLUGIN), "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-m", "genlab", "config", "method.name=toy_conditioned",
                          "method.toy_strength=0.75"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "toy_strength = 0.75" in out.stdout


def test_every_entry_has_its_registry_spec_type():
    from genlab.core.registry import all_registries
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            assert isinstance(spec, reg.spec_type), (kind, name)


def test_a_misspelt_capability_fails_at_registration():
    from genlab.core.registry import Registry
    from genlab.sampling.samplers import SamplerSpec
    reg = Registry("toy_kind_for_test", SamplerSpec)
    with pytest.raises(TypeError, match="nfe_per_stp"):
        reg.register("x", "doc", nfe_per_stp=2)(lambda: None)
    del __import__("genlab.core.registry").core.registry.REGISTRIES["toy_kind_for_test"]


def test_method_model_and_data_constraints_come_from_the_specs():
    with pytest.raises(GenlabError, match="method.name=mdlm trains on token data but data.name=digits provides image"):
        load_config(None, ["method.name=mdlm"])
    with pytest.raises(GenlabError, match="method.name=flow needs model.name=dit\\|dit_incontext\\|maskdit\\|mmdit"):
        load_config("text_ar", ["method.name=flow", "data.name=digits"])
    with pytest.raises(GenlabError, match="method.name=repa aligns"):
        load_config(None, ["method.name=repa", "model.name=mmdit"])
    with pytest.raises(GenlabError, match="method.name=mdlm needs model.causal=false"):
        load_config("text_mdlm", ["model.causal=true"])


def test_every_registering_module_is_imported_by_its_package():
    """Registration is explicit imports (each component package's __init__ lists its registering modules): a module
    that registers something but is missing from its package's list would silently not exist. Found here by text."""
    import re
    import sys
    from pathlib import Path

    import genlab
    from genlab.core.registry import load_entries
    load_entries()
    root = Path(genlab.__file__).parent
    registers = re.compile(r"^\s*@?\w*(registry\.register|_entry)\(", re.M)
    missing = []
    for path in sorted(root.rglob("*.py")):
        name = ".".join(("genlab",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        if name != "genlab.core.registry" and registers.search(path.read_text()) and name not in sys.modules:
            missing.append(name)
    assert not missing, f"registering modules that no package imports (add them to their package's __init__): {missing}"

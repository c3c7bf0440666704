"""Config metadata: every key declares its description and valid values; validate enforces them."""
import dataclasses
from typing import get_type_hints

import pytest
import tomllib

from genlab.config.fields import meta_of
from genlab.config.keys import sections
from genlab.config.tree import Config, dumps_toml, from_dict, load_config, to_dict
from genlab.core.errors import GenlabError


def all_fields():
    for sec, obj in sections(Config()):
        hints = get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            yield sec, f, hints[f.name]


def declares_range(f: dataclasses.Field, typ) -> bool:
    m = meta_of(f)
    return typ is bool or any(m.get(k) is not None for k in ("ge", "gt", "le", "lt", "choices", "registry", "free"))


def test_every_field_has_a_description_and_declared_values():
    """Fails for a field written `name: type = default  # comment`: use F(default, "doc", ge=/choices=/registry=/free=)."""
    bad = [f"{sec}.{f.name}" for sec, f, typ in all_fields()
           if not meta_of(f).get("doc") or not declares_range(f, typ)]
    assert not bad, f"fields without F(default, doc, <range>) metadata: {bad}"


def test_every_key_is_read_by_some_component_or_every_run():
    """No key that nothing reads: each is a core key or listed by a registered component (keys or reads)."""
    from genlab.config.doc import readers
    from genlab.config.fields import declared_by
    from genlab.config.keys import CORES
    core = {k.dotted for k in declared_by(tuple(CORES.values()))}
    orphans = [k for k, who in readers().items() if not who and k not in core]
    assert not orphans, orphans
    every = {f"{sec}.{f.name}" for sec, f, _ in all_fields()}
    assert every == set(readers())


def test_a_removed_key_loads_from_a_saved_config_only_at_its_old_default(monkeypatch):
    from genlab.config import tree as config_mod
    monkeypatch.setitem(config_mod.RETIRED, "method.gone_key", "")
    d = to_dict(Config())
    d["method"]["gone_key"] = ""
    assert to_dict(from_dict(d)) == to_dict(Config())
    d["method"]["gone_key"] = "runs/x"
    with pytest.raises(GenlabError, match="method.gone_key.*was removed"):
        from_dict(d)


def test_defaults_are_inside_their_declared_ranges():
    from genlab.config.check import check_config
    check_config(Config())


@pytest.mark.parametrize("override,key", [
    ("optim.lr=-1", "optim.lr"), ("train.ema_decay=1.5", "train.ema_decay"), ("optim.betas=[0.9,1.2]", "optim.betas"),
    ("data.on_device=maybe", "data.on_device"), ("model.patch_size=3", "model.patch_size"),
    ("model.heads=3", "model.heads"), ("data.path=/tmp/x", "data.path"), ("train.grad_accum=3", "train.grad_accum"),
    ("method.name=autoregressive", "method.name"), ("optim.lr=nan", "optim.lr"),
])
def test_validate_names_the_offending_key(override, key):
    with pytest.raises(GenlabError, match=key.replace(".", r"\.")):
        load_config("digits_flow", [override])


def test_text_preset_with_a_flow_method_is_one_line_error():
    with pytest.raises(GenlabError, match=r"method.name=flow trains on image\|latent data"):
        load_config("text_ar", ["method.name=flow"])


def test_unknown_keys_sections_and_names_suggest_the_closest():
    with pytest.raises(GenlabError, match="did you mean 'lr'"):
        load_config(None, ["optim.lrr=1"])
    with pytest.raises(GenlabError, match="did you mean 'optim'"):
        load_config(None, ["optimm.lr=1"])
    with pytest.raises(GenlabError, match="did you mean 'adamw'"):
        load_config(None, ["optim.name=adamww"])
    with pytest.raises(GenlabError, match="did you mean 'auto'"):
        load_config(None, ["data.on_device=autoo"])


def test_toml_writer_round_trips_characters_outside_the_bmp():
    cfg = load_config("text_ar", ["method.prompt=ROMEO 🎭 \"quoted\" \\ back\nline 𝄞"])
    text = dumps_toml(to_dict(cfg))
    back = from_dict(tomllib.loads(text))
    assert back.method.prompt == cfg.method.prompt
    assert to_dict(back) == to_dict(cfg)


def test_docs_config_md_is_current():
    from conftest import REPO

    from genlab.config.doc import markdown
    doc = (REPO / "docs" / "config.md").read_text()
    assert doc == markdown(), "docs/config.md is stale: run `python -m genlab.config.doc > docs/config.md`"


def test_docs_config_md_rows_are_one_line_each_with_five_cells():
    """A multi-line default (tomli-w writes arrays over several lines) used to break the table."""
    import re

    from genlab.config.doc import markdown
    rows = [line for line in markdown().splitlines() if line.startswith("| `")]
    assert len(rows) > 200 and "| `betas` | `[0.9, 0.99]` |" in markdown()
    for section in markdown().split("\n## [")[1:]:  # "data]", a blank line, then the table to the end
        for row in section.split("\n\n", 1)[1].strip().splitlines():
            assert row.startswith("| ") and row.endswith(" |") and len(re.split(r"(?<!\\)\|", row)) == 7, row


def test_genlab_config_prints_the_resolved_config_with_descriptions(capsys):
    from genlab.cli import main
    assert main(["config", "text_ar", "optim.lr=3e-4"]) == 0
    out = capsys.readouterr().out
    assert "# peak learning rate  [> 0]" in out
    assert to_dict(from_dict(tomllib.loads(out))) == to_dict(load_config("text_ar", ["optim.lr=3e-4"]))


def test_genlab_config_refuses_an_unknown_key_with_a_suggestion(capsys):
    from genlab.cli import main
    assert main(["config", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'lr'" in err and len(err.strip().splitlines()) == 1


def test_unused_sampling_option_is_a_warning_recorded_in_the_run_config(tmp_path, capsys):
    from conftest import TINY

    from genlab.training.trainer import Trainer
    cfg = load_config("digits_flow", TINY + [f"train.out_dir={tmp_path}", "train.name=w", "train.steps=1",
                                             "eval.num_samples=0", "method.top_k=5"])
    Trainer(cfg).fit()
    assert "warning: method.top_k is not read by method 'flow'" in capsys.readouterr().err
    text = (tmp_path / "w" / "config.toml").read_text()
    assert text.startswith("# warning: method.top_k is not read by method 'flow'")
    assert from_dict(tomllib.loads(text)).method.top_k == 5


def test_every_shipped_preset_loads_and_passes_the_checks():
    # a preset is a user-facing command (`genlab train NAME`): a key renamed in config.py or a value out of range in
    # one of them must fail here, not on the user's GPU
    from genlab.config.tree import CONFIG_DIR, load_config
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
    assert {"digits_flow", "mnist_flow", "mnist_flow_fast", "fashion_flow_fast"} <= set(names)
    for name in names:
        cfg = load_config(name, [])
        assert cfg.preset == name

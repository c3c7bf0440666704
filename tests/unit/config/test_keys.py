"""Typed component keys: a component's Keys class reads its keys from the config object itself, typed; a key name
is declared by one Keys class only; a plugin's class joins its section at run time."""
import dataclasses

import pytest

from conftest import unregister

from genlab.config import fields as cf
from genlab.config.keys import Config, MethodConfig, OptimConfig, declared_keys, section_class
from genlab.config.tree import load_config, to_dict
from genlab.core.errors import GenlabError
from genlab.sampling.samplers import step_schedule_registry
from genlab.families.few_step.base import TeacherKeys, TeacherPathKeys
from genlab.families.few_step.shortcut import ShortcutKeys
from genlab.families.image_flow.timesteps import LogitNormalKeys


def test_of_is_the_section_itself_with_typed_values():
    cfg = load_config("digits_flow", ["method.logit_std=0.5", "optim.lr=3e-4"])
    keys = LogitNormalKeys.of(cfg)
    assert keys is cfg.method and isinstance(cfg.method, MethodConfig) and isinstance(cfg.optim, OptimConfig)
    assert type(keys.logit_std) is float and keys.logit_std == 0.5 and type(keys.logit_mean) is float
    assert LogitNormalKeys.of(cfg.method) is cfg.method  # a section object works as well as the config
    cfg.method.logit_mean = 0.25  # one object: a write through either name is seen by both
    assert LogitNormalKeys.of(cfg).logit_mean == 0.25
    short = ShortcutKeys.of(cfg)
    assert type(short.shortcut_min_steps) is int and short.shortcut_min_steps == ShortcutKeys().shortcut_min_steps


def test_of_or_defaults_without_a_config_gives_the_declared_defaults():
    assert LogitNormalKeys.of_or_defaults(None) == LogitNormalKeys()
    assert LogitNormalKeys.of_or_defaults(None).logit_std == 1.0


def test_declared_holds_only_the_keys_a_class_defines_and_a_subclass_reads_its_bases_keys():
    assert [k.dotted for k in TeacherPathKeys.declared()] == ["method.teacher"]
    assert [k.dotted for k in TeacherKeys.declared()] == ["method.teacher_cfg_scale"]
    assert cf.dotted_of(TeacherKeys) == ("method.teacher", "method.teacher_cfg_scale")


def test_a_key_name_declared_by_two_keys_classes_is_refused():
    class Twice(cf.Keys, section="method"):
        logit_std: float = cf.F(1.0, "a second declaration of method.logit_std", gt=0)

    step_schedule_registry.register("test_twice", "declares method.logit_std again", keys=Twice)(lambda steps, cfg=None: None)
    try:
        with pytest.raises(RuntimeError, match="method.logit_std declared twice"):
            declared_keys()
    finally:
        unregister(step_schedule_registry, "test_twice")
    assert "method.logit_std" in declared_keys()


def test_a_keys_class_registered_at_run_time_joins_its_section():
    class Late(cf.Keys, section="method"):
        late_knob: int = cf.F(3, "a key added at run time", ge=0)

    before = section_class("method")
    step_schedule_registry.register("test_late", "reads method.late_knob", keys=Late)(lambda steps, cfg=None: None)
    try:
        cfg = Config()
        assert section_class("method") is not before and Late.of(cfg).late_knob == 3
        assert to_dict(cfg)["method"]["late_knob"] == 3
        with pytest.raises(GenlabError, match="no Late"):
            Late.of(_with_method(before()))
    finally:
        unregister(step_schedule_registry, "test_late")
    assert "late_knob" not in {f.name for f in dataclasses.fields(section_class("method"))}


def _with_method(method):
    cfg = Config()
    cfg.method = method
    return cfg


def test_an_annotation_that_contradicts_the_default_is_refused():
    class Wrong(cf.Keys, section="method"):
        wrong_knob: int = cf.F(0.5, "a float default under an int annotation", ge=0)

    with pytest.raises(TypeError, match="method.wrong_knob: annotated"):
        Wrong.declared()


def test_a_key_without_f_metadata_is_refused():
    with pytest.raises(TypeError, match="declare keys with F"):
        class Bare(cf.Keys, section="method"):
            bare: int = 1

"""What the few-step methods share: the flow teacher (`method.teacher=RUN`, docs/few_step.md), the student initialised
from it, and the consistency function.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import Extra, method_registry
from genlab.families.baselines import Baseline
from genlab.families.build import build_teacher  # noqa: F401 (re-exported)
from genlab.families.image_flow.flow import FlowMatching, cfg_velocity, unwrap
from genlab.nn.bitlinear import InputRMSNorm
from genlab.nn.conditions import ConditionSet
from genlab.runtime import checkpoint as ckpt


# method.teacher alone: for the methods that never use the teacher's own guidance scale (method.teacher_cfg_scale)
class TeacherPathKeys(cf.Keys, section="method"):
    teacher: str = cf.F("", "few-step distillation: the flow teacher (a run folder, checkpoint or exported model.safetensors "
                            "of a flow or REPA run on the same data)", free="a run folder, checkpoint or .safetensors path")


class TeacherKeys(TeacherPathKeys):
    teacher_cfg_scale: float = cf.F(0.0, "few-step distillation: guidance scale of the teacher's velocity (0 = the teacher "
                                         "run's own eval.cfg_scale)", ge=0)


def teacher_state(path: str) -> dict:
    if not path:
        raise GenlabError("this method needs method.teacher=RUN (a flow run folder, checkpoint or exported "
                          "model.safetensors)")
    try:
        return ckpt.load_checkpoint(path)
    except GenlabError as e:
        raise GenlabError(f"method.teacher: {e}") from None


def load_student_from_teacher(model: nn.Module, weights: dict, source: str) -> None:
    """The teacher's weights into the student; only its condition embedders (last layer zeroed: the teacher's function
    at step 0) and BitNet input norms (gain 1: a float teacher has none) may be missing."""
    sets = {name: m for name, m in model.named_modules() if isinstance(m, ConditionSet)}
    norms = [name for name, m in model.named_modules() if isinstance(m, InputRMSNorm)]
    own = model.state_dict()
    new_keys = [k for k in own if k not in weights]
    bad = [k for k in new_keys if not any(k.startswith(f"{p}.") for p in [*sets, *norms])] + [k for k in weights if k not in own]
    if bad:
        raise GenlabError(f"cannot initialise the student from method.teacher '{source}': its model differs "
                          f"(parameter {bad[0]}); the student needs the teacher's model.* settings")
    for k, v in weights.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise GenlabError(f"cannot initialise the student from method.teacher '{source}': shape of {k} "
                              f"{tuple(v.shape)} vs {tuple(own[k].shape)}; the student needs the teacher's model.* settings")
    model.load_state_dict(weights, strict=False)
    with torch.no_grad():
        for cset in sets.values():
            for emb in cset.embed.values():
                last = [m for m in emb.modules() if isinstance(m, nn.Linear)][-1]
                last.weight.zero_()
                if last.bias is not None:
                    last.bias.zero_()


class FewStepFlow(FlowMatching):
    """Flow matching's data, sampling and evaluation with an optional teacher; subclasses implement `loss`."""

    uses_teacher = False      # loads method.teacher as the frozen extra "teacher"
    init_from_teacher = True  # a fresh student starts from the teacher's weights (trained from scratch: False)
    data_kinds, output = ("image",), ""  # pixels only; what it predicts is no plain velocity (reflow's is)
    _teacher_state = None     # the teacher run's checkpoint, read once (None again once a module holds its weights)

    def _teacher(self) -> dict:
        """The teacher run's checkpoint (read once), or a one-line error when it cannot teach this student."""
        if self._teacher_state is None:
            path = TeacherPathKeys.of(self.mcfg).teacher
            state = teacher_state(path)
            self.teacher_cfg = tcfg = ckpt.config_of(state)
            teacher = method_registry.get(tcfg.method.name)
            if teacher.output != "velocity" or teacher.conditions:
                fits = [n for n, m in method_registry.items() if m.output == "velocity" and not m.conditions]
                raise GenlabError(f"method.teacher '{path}' was trained by method {tcfg.method.name}, which is not a "
                                  f"plain velocity predictor; a teacher is a run of: {', '.join(fits)}")
            tdata = state.get("data_spec") or {}
            for key in ("kind", "channels", "image_size", "num_classes"):
                if tdata.get(key) != self.spec.get(key):
                    raise GenlabError(f"method.teacher '{path}' was trained on other data ({key} {tdata.get(key)!r}, "
                                      f"this run's data has {self.spec.get(key)!r})")
            self._teacher_state = state
        return self._teacher_state

    def init_weights(self, model) -> None:
        if self.init_from_teacher:
            st = self._teacher()
            load_student_from_teacher(model, st["ema"] if st.get("ema") is not None else st["model"],
                                      TeacherPathKeys.of(self.mcfg).teacher)

    def extra_modules(self):
        extras = dict(super().extra_modules())
        if self.uses_teacher:
            extras["teacher"] = Extra(build_teacher(self._teacher()), trainable=False)
            self._teacher_state = None  # the weights live in the module now
        return extras

    def trivial_baselines(self, data, generator):
        # a constant model can meet a student's regression targets: the evaluation side says whether it learned
        return self.chance_accuracy()

    def chance_accuracy(self) -> list[Baseline]:
        """Sample accuracy at chance (1 / classes), where the run evaluates it (an absolute margin)."""
        metrics = [m.strip() for m in str(self.cfg.eval.metrics).split(",")]
        k = self.spec.get("num_classes", 0)
        if "accuracy" not in metrics or self.cfg.eval.num_samples <= 0 or k < 2:
            return []
        return [Baseline("sample_accuracy", 1 / k, "chance accuracy (1 / classes)", higher_is_better=True, scale=1.0)]

    def evaluate(self, model, data, ctx) -> dict:
        # a student trained on a pairs folder is scored against the teacher's data, not the teacher's samples
        return super().evaluate(model, data.reference() if hasattr(data, "reference") else data, ctx)

    def teacher_velocity(self, teacher, y):
        """The teacher's guided velocity field v(x, t) for labels y (one batched forward with CFG)."""
        scale = TeacherKeys.of(self.mcfg).teacher_cfg_scale or self.teacher_cfg.eval.cfg_scale
        return cfg_velocity(teacher, y, unwrap(teacher).null_class, scale)


def consistency_fn(net, x, t, y, **cond):
    """The consistency methods' f(x, t) = x + (1 - t) v(x, t, y, **cond), t [B]: the identity at t = 1 for any weights
    (no c_skip/c_out schedule)."""
    return x + (1 - t).view(-1, *([1] * (x.ndim - 1))).to(x.dtype) * net(x, t, y, **cond)


def pseudo_huber(a, b, c: float):
    """Per sample sqrt(ms(a - b) + c^2) - c (Song & Dhariwal 2023), ms the mean square (c per value; 0: the RMS)."""
    ms = (a.float() - b.float()).square().flatten(1).mean(1)
    return (ms + c * c).clamp_min(1e-20).sqrt() - c

"""COAT's FP8 optimizer states (Xi et al. 2024, arXiv 2410.19313): AdamW whose moments are stored in float8 e4m3 per
group of 128 elements after dynamic range expansion, f(x) = sign(x) |x / c|^k with k = log R / log R_X, quantised to
E4M3 with a per-group scale s and inverted on read: x = sign(q) (|q| s)^(1/k) c. The official kernel's form
(NVlabs/COAT, fp8_adamw_expand_cuda_kernel.cu: centre c = sqrt(max·min), k floored to a multiple of 1/16), with E4M3's
normal range R = 448 / 2^-6 as the default target instead of its 448²/2, which puts a group's smallest magnitudes into
the subnormals (`target_range=OFFICIAL_RANGE` gives theirs); why, and the read-back error bound: docs/precision.md.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from genlab.optim.build import cautious, optimizer_entry
from genlab.optim.caution import adamw_decay_factor
from genlab.optim.groups import param_groups
from genlab.optim.state import keep_saved_dtypes

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
NORMAL_RANGE = E4M3_MAX / 2.0 ** -6      # 28672: max / smallest normal of E4M3
OFFICIAL_RANGE = E4M3_MAX ** 2 / 2       # the official kernel's target (448^2 / 2)
GROUP = 128                              # the paper's and the official kernel's group size
K_STEP = 16                              # k is floored to a multiple of 1/K_STEP (official: expand_min = 16)
K_MAX = 32.0                             # groups of (nearly) equal magnitudes: any k fits; cap it


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % group
    return (F.pad(flat, (0, pad)) if pad else flat).view(-1, group)


def expand_quantize(x: torch.Tensor, group: int = GROUP, target_range: float = NORMAL_RANGE):
    """x (any shape) -> (codes: float8 e4m3 [x.numel()], scale, k, centre: float32 [groups]) per group of `group`
    consecutive elements (the last group zero-padded)."""
    g = _groups(x, group)
    a = g.abs()
    amax = a.amax(dim=1)
    amin = torch.where(a > 0, a, torch.full_like(a, math.inf)).amin(dim=1)
    live = amax > 0                                         # all-zero groups decode to zeros whatever their numbers
    amin = torch.where(live, amin, torch.ones_like(amin))
    amax1 = torch.where(live, amax, torch.ones_like(amax))
    centre = amax1.sqrt() * amin.sqrt()
    log_target = math.log2(target_range)
    log_ratio = torch.log2(amax1 / amin).clamp(min=log_target / K_MAX)
    k = (torch.floor(log_target / log_ratio * K_STEP) / K_STEP).clamp(min=1.0 / K_STEP)
    y = (a / centre[:, None]) ** k[:, None]                 # 0 stays 0 (k > 0)
    scale = (amax1 / centre) ** k / E4M3_MAX
    q = (torch.sign(g) * y / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX)
    return q.reshape(-1)[: x.numel()].to(E4M3), scale, k, centre


def dequantize(codes: torch.Tensor, scale: torch.Tensor, k: torch.Tensor, centre: torch.Tensor, shape,
               group: int = GROUP) -> torch.Tensor:
    """The inverse of expand_quantize: float32 tensor of `shape`."""
    q = _groups(codes.float(), group)
    y = q.abs() * scale[:, None]
    x = torch.sign(q) * y ** (1.0 / k[:, None]) * centre[:, None]
    return x.reshape(-1)[: codes.numel()].view(shape)


def param_step(p32, g, m_q, v_q, step, lr, *, beta1, beta2, eps, wd, group, target_range):
    """One AdamW update of a flat float32 parameter from its stored moments, as a pure function (what torch.compile
    fuses on CUDA): returns the new parameter and both moments re-quantised. m_q / v_q are (codes, scale, k, centre);
    step and lr are 0-d float32 tensors (a new value must not recompile)."""
    m = dequantize(*m_q, p32.shape, group).lerp(g, 1 - beta1)
    v = dequantize(*v_q, p32.shape, group).mul(beta2).addcmul(g, g, value=1 - beta2)
    c1 = 1 - beta1 ** step                                  # tensors: no host sync for the step count
    c2_sqrt = (1 - beta2 ** step).sqrt()
    p32 = p32 * (1 - lr * wd) - lr * m / (c1 * (v.sqrt() / c2_sqrt + eps))
    return p32, expand_quantize(m, group, target_range), expand_quantize(v, group, target_range)


class CoatAdamW(torch.optim.Optimizer):
    """AdamW with both moments in E4M3 after dynamic range expansion, per group of `group_size` elements. State per
    parameter: step, exp_avg / exp_avg_sq (flat float8 codes) and per group their _scale, _k, _centre (float32).
    `compiled` (default: on SM89+ CUDA) runs `param_step` through torch.compile with a symbolic length, one graph for
    every parameter (eager: ~40 small kernels per parameter)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, group_size: int = GROUP,
                 target_range: float = NORMAL_RANGE, compiled: bool | None = None):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.group_size, self.target_range = group_size, target_range
        if compiled is None:  # inductor's float8 casts need SM89+ (H100/H200, Ada)
            cuda = [p for g in self.param_groups for p in g["params"] if p.is_cuda]
            compiled = bool(cuda) and torch.cuda.get_device_capability(cuda[0].device) >= (8, 9)
        self._step_fn = torch.compile(param_step, dynamic=True) if compiled else param_step
        self._lr = {}  # device -> 0-d float32 tensor refilled each step: no new tensor (no copy, no sync) per param

    def _moment(self, st, name):
        return st[name], st[f"{name}_scale"], st[f"{name}_k"], st[f"{name}_centre"]

    def _write(self, st, name, q):
        st[name], st[f"{name}_scale"], st[f"{name}_k"], st[f"{name}_centre"] = q

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lrs = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    for name in ("exp_avg", "exp_avg_sq"):
                        self._write(st, name, expand_quantize(torch.zeros(p.numel(), device=p.device), self.group_size,
                                                              self.target_range))
                st["step"] += 1
                if p.device not in lrs:
                    t = self._lr.setdefault(p.device, torch.zeros((), dtype=torch.float32, device=p.device))
                    lrs[p.device] = t.copy_(group["lr"]) if torch.is_tensor(group["lr"]) else t.fill_(group["lr"])
                p32, m_q, v_q = self._step_fn(
                    p.detach().reshape(-1).float(), p.grad.reshape(-1).float(), self._moment(st, "exp_avg"),
                    self._moment(st, "exp_avg_sq"), st["step"], lrs[p.device], beta1=beta1, beta2=beta2, eps=group["eps"],
                    wd=group["weight_decay"], group=self.group_size, target_range=self.target_range)
                p.copy_(p32.view(p.shape))
                self._write(st, "exp_avg", m_q)
                self._write(st, "exp_avg_sq", v_q)
        return loss


@optimizer_entry("adamw_coat", "COAT FP8 optimizer states (Xi et al. 2024): AdamW with both moments in E4M3 per 128 "
                               "elements after dynamic range expansion; genlab's own, plain torch (CPU too); caution: wrapper",
                 fsdp=False)
def adamw_coat(model, ocfg):
    # torch's load_state_dict casts every floating state tensor to the parameter's dtype: keep the float8 codes float8
    opt = keep_saved_dtypes(CoatAdamW(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                                      eps=ocfg.eps))
    return cautious(opt, ocfg, decay_factor=adamw_decay_factor)

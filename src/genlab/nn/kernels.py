"""Kernel choices with a plain-PyTorch path elsewhere (model.ce_kernel, qkv_kernel, final_kernel, mlp, adaln): their
spec, and the config check of where such a choice can run."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from genlab.config.check import _trains_on_cpu
from genlab.core.errors import GenlabError
from genlab.core.registry import Spec


@dataclass(frozen=True, kw_only=True)
class KernelSpec(Spec):
    """A kernel choice with a plain-PyTorch path elsewhere: `cuda_only` entries refuse CPU training at config time
    (their forward still runs anywhere, as the plain composition), `package` names the import it needs."""
    cuda_only: bool = False                # its fused kernel runs on CUDA tensors only
    package: str = ""                      # top-level module it imports on CUDA (checked with the config)
    install_problem: Callable[[], str] | None = None  # on CUDA, with the package there: "" or why its install won't run

    def check_choice(self, cfg, key, name, registry):
        """A CUDA-only kernel for CPU training, or (on a CUDA machine) one whose package is missing."""
        if self.cuda_only and _trains_on_cpu(cfg.train.device):
            cpu = [n for n, s in registry.specs() if not s.cuda_only]
            raise GenlabError(f"{key}={name} is a CUDA kernel and this run trains on the CPU; "
                              f"valid choices on the CPU: {', '.join(cpu)}")
        refuse_missing_package(self.package, key, name, registry)
        if self.install_problem and torch.cuda.is_available() and (why := self.install_problem()):
            raise GenlabError(f"{key}={name}: {why}")


def refuse_missing_package(package: str, key: str, name: str, registry) -> None:
    """A choice whose package is missing, in one line naming the choices whose packages are there (entries declare
    `package`). It matters where the run will import it: a machine with CUDA (suites are checked on CPU machines)."""
    if package and torch.cuda.is_available() and importlib.util.find_spec(package) is None:
        ok = [n for n, s in registry.specs() if not s.package or importlib.util.find_spec(s.package) is not None]
        raise GenlabError(f"{key}={name} needs the '{package}' package (not installed); valid choices: {', '.join(ok)}")


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on x runs in: autocast's where it is on, else x's."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype

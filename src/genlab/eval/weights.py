"""Where pretrained metric weights are looked up: an explicit path (config key), an environment variable,
then torch's hub checkpoint folder ($TORCH_HOME/hub/checkpoints, by default ~/.cache/torch/hub/checkpoints),
the folder torch.hub / torchvision / pytorch-fid download into. Nothing is ever downloaded here."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from genlab.core.errors import GenlabError


def hub_checkpoints() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def find_file(names: tuple[str, ...], explicit: str, env: str, key: str, what: str, url: str) -> Path:
    """The first existing file among `names` in the lookup folders (an explicit path may be the file
    itself); else a one-line GenlabError naming the places and how to get the file."""
    tried = []
    for label, p in (("config", explicit), (f"${env}", os.environ.get(env)), ("torch hub", hub_checkpoints())):
        if not p:
            continue
        p = Path(p).expanduser()
        if p.is_file() and label != "torch hub":
            return p
        for n in names:
            if (p / n).is_file():
                return p / n
        tried.append(str(p))
    if explicit and not Path(explicit).expanduser().exists():
        raise GenlabError(f"{key}={explicit} does not exist; {what} needs {names[0]} ({url})")
    raise GenlabError(f"{what} needs the weights file {names[0]}, not found in {', '.join(tried)} "
                      f"(set {key} or ${env}); download {url} into {hub_checkpoints()} (README: Evaluation metrics)")


def load_state(path: Path, what: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (truncated download, HTML error page saved as .pth)
        raise GenlabError(f"{what}: cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise GenlabError(f"{what}: {path} holds no state dict")
    return state

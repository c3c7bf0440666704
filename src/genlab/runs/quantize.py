"""`genlab quantize RUN --to FORMAT`: a new run folder holding the chosen float weights and a quantization record;
`genlab sample` / `genlab eval` re-apply the record when they load it (genlab.runs.load.load_run)."""
from __future__ import annotations

import json
from pathlib import Path

from genlab.core.errors import GenlabError
from genlab.nn.ptq import check_format, quantize_model
from genlab.runs.load import model_from_state
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.export_folder import is_export_folder
from genlab.runtime.parallel import resolve_device

# what only resuming training reads: a quantized run is for sampling and evaluation
TRAINING_ONLY = ("optimizer", "scaler", "loader", "gen", "torch_rng", "device_rng")
RECORD_NAME = "quant.json"


def source_dir(run_or_ckpt) -> Path:
    p = ckpt.resolve_checkpoint(run_or_ckpt)
    if is_export_folder(p):  # genlab export's folder: its output goes next to it
        return p
    return p.parent.parent if p.parent.name == "checkpoints" else p.parent


def pick_weights(state: dict, weights: str | None) -> tuple[dict, str]:
    """The EMA by default (what sample/eval use), the raw weights on request; an explicit ema without one is refused."""
    if weights not in (None, "ema", "model"):
        raise GenlabError(f"--weights {weights}: valid choices: ema, model")
    if weights == "model" or (weights is None and state.get("ema") is None):
        return state["model"], "model" if weights else "model (the run has no EMA)"
    if state.get("ema") is None:
        raise GenlabError("--weights ema: this run kept no EMA (train.ema_decay=0); use --weights model")
    return state["ema"], "ema"


def quantize_run(run, fmt: str, out=None, weights: str | None = None, device="cpu", adaln: bool = False) -> dict:
    """Quantize a run's weights into a new folder (never over an existing one); returns the record."""
    dev = resolve_device(device, key="--device")
    check_format(fmt, dev)  # an unknown format or one this device cannot run: before anything is read
    out = Path(out) if out else (src := source_dir(run)).parent / f"{src.name}_{fmt}"  # default: RUN_FORMAT beside RUN
    if out.exists():
        raise GenlabError(f"'{out}' exists; choose another --out (a quantized run is never written over)")
    state = ckpt.load_checkpoint(run)
    if state.get("quant"):
        raise GenlabError(f"'{run}' is already quantized ({state['quant'].get('format')}); quantize its source run")
    chosen, which = pick_weights(state, weights)
    kept = {k: v for k, v in state.items() if k not in TRAINING_ONLY}
    kept.update(model=chosen, ema=None)
    # measure on the model as sample/eval will build it (converters applied), then keep only the record
    _, model, _, _, _ = model_from_state(kept, str(run), str(dev), ema=False)
    record = quantize_model(model, fmt, dev, adaln=adaln)
    record = {**record, "source": str(ckpt.resolve_checkpoint(run)), "source_step": int(state.get("step", 0)),
              "weights": which, "device": dev.type}
    kept["quant"] = record
    out.mkdir(parents=True)
    ckpt._atomic_save(kept, ckpt.ckpt_dir(out) / f"step_{int(state.get('step', 0)):08d}.pt")
    (out / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    src_cfg = source_dir(run) / "config.toml"
    if src_cfg.is_file():
        (out / "config.toml").write_text(src_cfg.read_text())
    return {**record, "out": str(out)}


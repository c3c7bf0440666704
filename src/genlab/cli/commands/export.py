"""`genlab export RUN --out model.safetensors`: consolidated weights of any run (single-file or DCP checkpoint)."""
from __future__ import annotations

from pathlib import Path

from genlab.errors import GenlabError

ORDER = 8


def cmd_export(args):
    from genlab.train.checkpoint import load_checkpoint
    from genlab.train.dcp import export_safetensors
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise GenlabError(f"--out must end in .safetensors, got '{out}'")
    if out.exists() and not args.force:
        raise GenlabError(f"'{out}' exists; pass --force to overwrite")
    state = load_checkpoint(args.run)
    if state.get("quant"):  # its file holds the source's float weights; torchao's tensors are rebuilt at load
        raise GenlabError(f"'{args.run}' is a quantized run ({state['quant'].get('format')}): export its source run "
                          f"{state['quant'].get('source')}")
    # load as sample/eval do (converters re-applied): the written weights are those of the converted model
    from genlab.sample import load_run
    _, model, _, _, _ = load_run(args.run, "cpu", ema=not args.no_ema)
    key = "ema" if not args.no_ema and state.get("ema") is not None else "model"
    state = {**state, key: {k: v for k, v in model.state_dict().items()}}
    path = export_safetensors(state, out, ema=not args.no_ema)
    print(f"wrote {path} (step {state.get('step', 0)}, {'raw' if args.no_ema or state.get('ema') is None else 'EMA'} weights)")
    return 0


def add_parser(sub):
    p = sub.add_parser("export", help="write a run's consolidated weights as one safetensors file (sample/eval load it)")
    p.add_argument("run", help="run folder or checkpoint (step_N.pt file or step_N.dcp folder)")
    p.add_argument("--out", required=True, help="output .safetensors file")
    p.add_argument("--no-ema", action="store_true", help="export the raw weights instead of the EMA")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(fn=cmd_export)
    return p

"""`genlab export RUN --out DIR`: a self-describing folder others load (config.toml, model.safetensors, a model card,
genlab.json; see runtime/export_folder.py). `--out FILE.safetensors`: the consolidated weights as one file."""
from __future__ import annotations

import json
from pathlib import Path

from genlab.core.errors import GenlabError

ORDER = 8


def cmd_export(args):
    out = Path(args.out)
    if out.suffix != ".safetensors":
        from genlab.runs.export import check_out, export_folder
        check_out(out, args.force)  # before any work: an existing folder needs --force
        export_folder(args.run, out, ema=not args.no_ema, force=args.force)
        meta, n = json.loads((out / "genlab.json").read_text()), _tied(out)
        tied = f", {n} tied tensor(s) stored once" if n else ""
        print(f"wrote {out}/ (step {meta['step']}, {'EMA' if meta['weights'] == 'ema' else 'raw'} weights{tied}): "
              f"config.toml, model.safetensors, genlab.json, README.md; upload with `hf upload USER/NAME {out} .`")
        return 0
    if out.exists() and not args.force:
        raise GenlabError(f"'{out}' exists; pass --force to overwrite")
    from genlab.runs.export import exported_state
    from genlab.runtime.dcp import export_safetensors
    state, _ = exported_state(args.run, ema=not args.no_ema)
    path = export_safetensors(state, out, ema=not args.no_ema)
    weights = "raw" if args.no_ema or state.get("ema") is None else "EMA"
    print(f"wrote {path} (step {state.get('step', 0)}, {weights} weights)")
    return 0


def _tied(out: Path) -> int:
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return len(json.loads((f.metadata() or {}).get("genlab_tied", "{}")))


def add_parser(sub):
    p = sub.add_parser("export", help="write a run as a folder others load (config, safetensors, model card) or one "
                                      "safetensors file; sample/eval/load_run load both")
    p.add_argument("run", help="run folder or checkpoint (step_N.pt file or step_N.dcp folder)")
    p.add_argument("--out", required=True, help="output folder, or a .safetensors file for the weights alone")
    p.add_argument("--no-ema", action="store_true", help="export the raw weights instead of the EMA")
    p.add_argument("--force", action="store_true", help="replace --out (a folder only when it is a genlab export)")
    p.set_defaults(fn=cmd_export)

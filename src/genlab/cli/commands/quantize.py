"""`genlab quantize RUN --to nf4|int8|int4|fp8`: post-training weight quantization into a new run folder that
sample/eval load. The quantization gap at every checkpoint of a run is `genlab analyze quant-gap RUN`."""
from __future__ import annotations

import json

from genlab.core.errors import GenlabError

ORDER = 10


def cmd_quantize(args):
    if not args.to:
        raise GenlabError("give --to FORMAT (nf4, int8, int4, fp8); the gap per checkpoint is `genlab analyze quant-gap RUN`")
    from genlab.runs.quantize import quantize_run
    rec = quantize_run(args.run, args.to, out=args.out, weights=args.weights, device=args.device, adaln=args.adaln)
    print(json.dumps({k: v for k, v in rec.items() if k != "layers"}, indent=2))
    print(f"wrote {rec['out']} ({len(rec['layers'])} linears in {rec['format']}; weight memory "
          f"{rec['weight_memory_ratio']:.0%} of bf16): genlab sample {rec['out']} / genlab eval {rec['out']}")
    return 0


def add_parser(sub):
    p = sub.add_parser("quantize", help="post-training weight quantization of a run (nf4, int8, int4, fp8); the gap "
                                        "per checkpoint: genlab analyze quant-gap RUN")
    p.add_argument("run", help="run folder or checkpoint file")
    p.add_argument("--to", default=None, metavar="FORMAT", help="nf4, int8 (CPU and GPU), int4, fp8 (CUDA)")
    p.add_argument("--out", default=None, help="output run folder, never overwritten (default: RUN_FORMAT beside RUN)")
    p.add_argument("--weights", default=None, choices=("ema", "model"), help="which weights (default: ema, else model)")
    p.add_argument("--adaln", action="store_true", help="quantize the blocks' adaLN modulation linears too")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the quantized run will run")
    p.set_defaults(fn=cmd_quantize)

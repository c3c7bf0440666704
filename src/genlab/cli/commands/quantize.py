"""`genlab quantize RUN --to nf4|int8|int4|fp8`: post-training weight quantization into a new run folder that
sample/eval load; `genlab quantize RUN --gap`: the quantization gap at every checkpoint of a run."""
from __future__ import annotations

import json

from genlab.errors import GenlabError

ORDER = 10


def cmd_quantize(args):
    if args.gap:
        if args.to or args.out or args.weights:
            raise GenlabError("--gap evaluates every checkpoint of RUN in place: it takes --formats, not --to/--out/--weights")
        from genlab.quant.gap import quant_gap
        res = quant_gap(args.run, formats=[f for f in args.formats.split(",") if f], overrides=list(args.overrides),
                        device=args.device, adaln=args.adaln)
        print(res["table"])
        print(f"wrote {res['markdown']} and {res['plot']}")
        return 0
    if args.overrides:
        raise GenlabError(f"eval overrides ({args.overrides[0]}, ...) go with --gap; `genlab eval` the quantized run")
    if not args.to:
        raise GenlabError("give --to FORMAT (nf4, int8, int4, fp8) or --gap")
    from genlab.quant.run import quantize_run
    rec = quantize_run(args.run, args.to, out=args.out, weights=args.weights, device=args.device, adaln=args.adaln)
    print(json.dumps({k: v for k, v in rec.items() if k != "layers"}, indent=2))
    print(f"wrote {rec['out']} ({len(rec['layers'])} linears in {rec['format']}; weight memory "
          f"{rec['weight_memory_ratio']:.0%} of bf16): genlab sample {rec['out']} / genlab eval {rec['out']}")
    return 0


def add_parser(sub):
    p = sub.add_parser("quantize", help="post-training weight quantization of a run (nf4, int8, int4, fp8), "
                                        "or --gap: the quantization gap at every checkpoint")
    p.add_argument("run", help="run folder or checkpoint file")
    p.add_argument("overrides", nargs="*", help="--gap: eval.* overrides, e.g. eval.num_samples=1000")
    p.add_argument("--to", default=None, metavar="FORMAT", help="nf4, int8 (CPU and GPU), int4, fp8 (CUDA)")
    p.add_argument("--out", default=None, help="output run folder, never overwritten (default: RUN_FORMAT beside RUN)")
    p.add_argument("--weights", default=None, choices=("ema", "model"), help="which weights (default: ema, else model)")
    p.add_argument("--adaln", action="store_true", help="quantize the blocks' adaLN modulation linears too")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the quantized run will run")
    p.add_argument("--gap", action="store_true", help="evaluate every checkpoint float and quantized; writes "
                                                      "RUN/analysis/quant_gap.md and .png")
    p.add_argument("--formats", default="int8,nf4", help="--gap: formats to compare with the float model (default: int8,nf4)")
    p.set_defaults(fn=cmd_quantize)
    return p

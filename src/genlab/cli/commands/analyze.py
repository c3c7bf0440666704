"""`genlab analyze RUN`: layer similarity (CKA), layer skipping and a cached-block sampler of an image flow run;
`genlab analyze quant-gap RUN`: the post-training quantization gap at every checkpoint of a run (genlab/runs/quant_gap.py);
`genlab analyze compare RUN RUN ...`: several runs' analyses side by side (genlab/lab/analyze/compare.py)."""
from __future__ import annotations

from genlab.core.errors import GenlabError

ORDER = 2.5  # after eval


def cmd_analyze(args):
    if args.run == "quant-gap":
        from genlab.runs.quant_gap import quant_gap
        if not args.overrides:
            raise GenlabError("genlab analyze quant-gap RUN [eval.*=...]: give the run folder")
        res = quant_gap(args.overrides[0], formats=[f for f in args.formats.split(",") if f], overrides=args.overrides[1:],
                        device=args.device, adaln=args.adaln)
        print(res["table"])
        print(f"wrote {res['markdown']} and {res['plot']}")
        return 0
    if args.run == "compare":
        from genlab.lab.analyze.compare import compare
        res = compare(args.overrides, args.out or "analysis_compare")
        print(res["markdown"])
        print(f"wrote {res['out']}/compare.md (and the heat maps beside it)")
        return 0
    from genlab.lab.analyze.run import analyze_run
    res = analyze_run(args.run, what=args.what, batch=args.batch, t=args.t, device=args.device, out=args.out,
                      overrides=args.overrides, cache_blocks=args.cache_blocks, cache_every=args.cache_every,
                      cache_tol=args.cache_fd_tol)
    print(f"wrote {res['out']}/analysis.md (and the plots beside it)")
    return 0


def add_parser(sub):
    a = sub.add_parser("analyze", help="what the layers of an image flow run learn: CKA heat maps, layer skipping, "
                                       "a cached-block sampler (docs/analyze.md)")
    a.add_argument("run", help="run folder or checkpoint file; or `quant-gap RUN`: the quantization gap per checkpoint; "
                              "or `compare RUN RUN ...`: analysed runs side by side")
    a.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.num_samples=1000 (the samples scored)")
    a.add_argument("--what", default="cka,skip,cache", help="analyses, comma-separated: cka, skip, cache (default: all)")
    a.add_argument("--batch", type=int, default=64, help="real images in the CKA batch (default: 64)")
    a.add_argument("--t", default="0.1,0.5,0.9", help="noise levels of the CKA heat maps, 0 noise .. 1 data "
                                                       "(default: 0.1,0.5,0.9)")
    a.add_argument("--cache-blocks", default="auto", help="blocks the cached sampler reuses: auto (searched: in order "
                   "of least change between steps, each block kept if the cache keeps FD within --cache-fd-tol), half "
                   "(the half that changes least, not searched) or indices, e.g. 3,4,5 (default: auto)")
    a.add_argument("--cache-fd-tol", type=float, default=1.1, help="--cache-blocks auto: the cached sampler's FD may be "
                   "at most this multiple of the unskipped FD (default: 1.1)")
    a.add_argument("--cache-every", type=int, default=2, help="cached blocks recompute every N network evaluations "
                                                              "(default: 2)")
    a.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    a.add_argument("--out", default=None, help="output folder (default: RUN/analysis; compare: ./analysis_compare)")
    a.add_argument("--formats", default="int8,nf4", help="quant-gap: formats compared with the float model "
                                                          "(default: int8,nf4)")
    a.add_argument("--adaln", action="store_true", help="quant-gap: quantize the blocks' adaLN linears too")
    a.set_defaults(fn=cmd_analyze)

"""`genlab eval RUN [eval.key=value ...] [--metrics LIST]`: evaluate a run or checkpoint, print the metrics as JSON.
`genlab eval RUN eval.fid_ref=FILE.npz` alone scores the standard protocol's metrics that the file supports (fid,
sfid, inception_score, pr_inception; docs/fid.md)."""
from __future__ import annotations

import json
import sys

ORDER = 2


def cmd_eval(args):
    from genlab.runs.load import evaluate_run
    metrics = [f"eval.metrics={args.metrics}"] if args.metrics is not None else []
    ref = [o.split("=", 1)[1] for o in args.overrides if o.strip().startswith("eval.fid_ref=")]
    if ref and ref[-1] and not metrics and not any(o.strip().startswith("eval.metrics=") for o in args.overrides):
        from genlab.eval.metrics import protocol_metrics
        metrics = [f"eval.metrics={protocol_metrics(ref[-1])}"]
        print(f"eval.fid_ref without eval.metrics: scoring {metrics[0]}", file=sys.stderr)
    res = evaluate_run(args.run, overrides=list(args.overrides) + metrics, device=args.device)
    print(json.dumps(res, indent=2, default=str))
    return 0


def add_parser(sub):
    e = sub.add_parser("eval", help="evaluate a run or checkpoint (sample accuracy, FD, precision/recall, FID, sFID, IS, LPIPS / "
                                        "likelihood bounds)")
    e.add_argument("run")
    e.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.num_samples=1000")
    e.add_argument("--device", default="auto")
    e.add_argument("--metrics", default=None, metavar="LIST",
                   help="image metrics, comma-separated: accuracy,fd,pr (default, offline), fid, sfid, inception_score, "
                        "pr_inception, lpips (need weights); same as eval.metrics=LIST (with eval.fid_ref=FILE and no "
                        "LIST: the standard protocol's metrics that FILE supports)")
    e.set_defaults(fn=cmd_eval)

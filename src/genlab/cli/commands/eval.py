"""`genlab eval RUN [eval.key=value ...] [--metrics LIST]`: evaluate a run or checkpoint, print the metrics as JSON."""
from __future__ import annotations

import json

ORDER = 2


def cmd_eval(args):
    from genlab.sample import evaluate_run
    metrics = [f"eval.metrics={args.metrics}"] if args.metrics is not None else []
    res = evaluate_run(args.run, overrides=list(args.overrides) + metrics, device=args.device)
    print(json.dumps(res, indent=2, default=str))
    return 0


def add_parser(sub):
    e = sub.add_parser("eval", help="evaluate a run or checkpoint (sample accuracy, FD, precision/recall, FID, LPIPS / likelihood bounds)")
    e.add_argument("run")
    e.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.num_samples=1000")
    e.add_argument("--device", default="auto")
    e.add_argument("--metrics", default=None, metavar="LIST",
                   help="image metrics, comma-separated: accuracy,fd,pr (default, offline), fid, lpips (need weights); "
                        "same as eval.metrics=LIST")
    e.set_defaults(fn=cmd_eval)
    return e

"""`genlab sample RUN`: draw samples from a run or checkpoint (an image grid, or text for text models)."""
from __future__ import annotations

ORDER = 1


def cmd_sample(args):
    from genlab.sample import sample_to_file
    path = sample_to_file(args.run, n=args.n, steps=args.steps, cfg_scale=args.cfg, class_id=args.class_id,
                          out=args.out, seed=args.seed, sampler=args.sampler, device=args.device, ema=not args.no_ema,
                          **{k: v for k, v in (("prompt", args.prompt), ("temperature", args.temperature),
                                               ("top_k", args.top_k), ("complete", args.complete or None),
                                               ("attention", args.attention)) if v is not None})
    print(f"wrote {path}")
    return 0


def add_parser(sub):
    s = sub.add_parser("sample", help="draw samples from a run or checkpoint into a PNG grid")
    s.add_argument("run", help="run folder or checkpoint file")
    s.add_argument("--n", type=int, default=64)
    s.add_argument("--steps", type=int, default=None)
    s.add_argument("--cfg", type=float, default=None, help="classifier-free guidance scale")
    s.add_argument("--class", dest="class_id", type=int, default=None, help="class id (default: cycle over classes)")
    s.add_argument("--sampler", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    s.add_argument("--out", default=None, help="output file (default: RUN/sample_grid.png)")
    s.add_argument("--prompt", default=None, help="text models: prompt text (mdlm: [[N]] marks N tokens to infill)")
    s.add_argument("--temperature", type=float, default=None, help="text models: sampling temperature (0 = greedy)")
    s.add_argument("--top-k", dest="top_k", type=int, default=None, help="autoregressive: sample among the k most likely tokens")
    s.add_argument("--complete", action="store_true", help="image_ar: complete held-out images from their top half")
    s.add_argument("--attention", default=None, metavar="ROW,COL", help="image_ar: attention maps of the pixel ROW,COL")
    s.set_defaults(fn=cmd_sample)
    return s

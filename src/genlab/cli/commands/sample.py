"""`genlab sample RUN`: draw samples from a run or checkpoint (an image grid, or text for text models)."""
from __future__ import annotations

import argparse

ORDER = 1
SHOW_TEXTS = 3  # text runs: the first samples printed on the console (all n go to the file)


def cmd_sample(args):
    from genlab.runs.load import sample_to_file
    path = sample_to_file(args.run, n=args.n, steps=args.steps, cfg_scale=args.cfg, class_id=args.class_id,
                          out=args.out, seed=args.seed, sampler=args.sampler, device=args.device, ema=not args.no_ema,
                          overrides=args.overrides,
                          **{k: v for k, v in (("prompt", args.prompt), ("temperature", args.temperature),
                                               ("top_k", args.top_k), ("length", args.length),
                                               ("complete", args.complete or None),
                                               ("attention", args.attention)) if v is not None})
    texts = []
    if path.suffix == ".txt":  # text: show the first few, the file has them all
        from genlab.families.lm.common import read_samples
        texts = read_samples(path)
    for i, t in enumerate(texts[:SHOW_TEXTS]):
        print(f"===== sample {i} =====\n{t}")
    print(f"wrote {path} ({len(texts)} samples; the first {min(len(texts), SHOW_TEXTS)} above)" if texts else f"wrote {path}")
    return 0


class _DefaultsHelp(argparse.HelpFormatter):
    """`(default: X)` after an option's help, unless the help already says it or there is no default to show."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "default" in h or any(action.default is d for d in (None, False, argparse.SUPPRESS)) or not action.option_strings:
            return h
        return f"{h} (default: %(default)s)" if h else "(default: %(default)s)"


def add_parser(sub):
    s = sub.add_parser("sample", help="draw samples from a run or checkpoint: a PNG grid, or text for text runs",
                       formatter_class=_DefaultsHelp)
    s.add_argument("run", help="run folder, checkpoint file or exported folder (genlab export)")
    s.add_argument("overrides", nargs="*", help="the run's sampling keys (no eval.*), e.g. method.cache_blocks=auto "
                                                "method.cache_every=2 (flow: reuse the blocks `genlab analyze` picked)")
    s.add_argument("--n", type=int, default=64, help="how many samples (text runs print the first "
                                                     f"{SHOW_TEXTS} and write all to the file)")
    s.add_argument("--steps", type=int, default=None,
                   help="sampler steps: flow ODE steps, mdlm denoising steps (default: the run's method.sample_steps); "
                        "autoregressive: new tokens, as --length")
    s.add_argument("--cfg", type=float, default=None, help="classifier-free guidance scale (default: the run's method.cfg_scale)")
    s.add_argument("--class", dest="class_id", type=int, default=None, help="class id (default: cycle over classes, each grid column one class)")
    s.add_argument("--sampler", default=None, help="flow sampler, e.g. euler, heun (default: the run's method.sampler)")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    s.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    s.add_argument("--out", default=None, help="output file (default: RUN/sample_grid.png; text runs: RUN/sample_grid.txt)")
    s.add_argument("--prompt", default=None, help="text models: prompt text (mdlm: [[N]] marks N tokens to infill)")
    s.add_argument("--length", type=int, default=None,
                   help="text models: tokens to generate, >= 1 (default: the run's method.sample_len, else data.seq_len); "
                        "mdlm: at most data.seq_len; autoregressive: any, the context slides past data.seq_len")
    s.add_argument("--temperature", type=float, default=None,
                   help="text models: sampling temperature, 0 = greedy (default: the run's method.temperature)")
    s.add_argument("--top-k", dest="top_k", type=int, default=None,
                   help="autoregressive: sample among the k most likely tokens (default: the run's method.top_k)")
    s.add_argument("--complete", action="store_true", help="image_ar: complete held-out images from their top half")
    s.add_argument("--attention", default=None, metavar="ROW,COL", help="image_ar: attention maps of the pixel ROW,COL")
    s.set_defaults(fn=cmd_sample)

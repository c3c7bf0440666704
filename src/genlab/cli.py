"""genlab command line: train | sample | eval | data | list | config (+ bench, sweep, export, world via cli_extra), --version."""
from __future__ import annotations

import argparse
import json
import sys

from genlab.errors import GenlabError


def _split_config_and_overrides(items):
    """First positional may be a preset name or .toml; everything with '=' is an override."""
    preset, overrides = None, []
    for it in items:
        if "=" in it:
            overrides.append(it)
        elif preset is None:
            preset = it
        else:
            raise GenlabError(f"unexpected argument '{it}': give one CONFIG and then key=value overrides")
    return preset, overrides


def cmd_train(args):
    from genlab.config import load_config
    from genlab.train.trainer import Trainer, config_for_resume
    preset, overrides = _split_config_and_overrides(args.items)
    if args.resume:
        if preset:
            raise GenlabError("--resume takes the config saved with the run; give only key=value overrides")
        cfg = config_for_resume(args.resume, overrides)
    else:
        cfg = load_config(preset, overrides)
    trainer = Trainer(cfg, resume=args.resume)
    summary = trainer.fit()
    print_summary(summary)
    return 0 if summary.get("status") in ("finished", "interrupted") else 1


def print_summary(s: dict):
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)
    lines = [f"run: {s.get('run_dir')}  status: {s.get('status')}  steps: {s.get('step')}  wall: {fmt(s.get('wall_time'), '.1f')} s",
             f"final loss: {fmt(s.get('loss'), '.4f')}  throughput: {fmt(s.get('samples_per_s'), '.1f')} samples/s  "
             f"MFU: {'n/a' if s.get('mfu') is None else format(100 * s['mfu'], '.1f') + '%'}  "
             f"peak mem: {'n/a' if s.get('peak_mem_gib') is None else format(s['peak_mem_gib'], '.2f') + ' GiB'}"]
    if "eval_samples" in s:  # image metrics: every distance beside its real-vs-real floor
        from genlab.eval.metrics import summary_line
        lines.append(summary_line(s))
    for k, v in s.items():
        if k.startswith(("val_", "bpc", "ppl", "nelbo")) and isinstance(v, (int, float)):
            lines.append(f"{k}: {v:.4f}")
    if s.get("samples"):
        lines.append(f"samples: {s['samples']}")
    print("\n".join(lines))


def cmd_sample(args):
    from genlab.sample import sample_to_file
    path = sample_to_file(args.run, n=args.n, steps=args.steps, cfg_scale=args.cfg, class_id=args.class_id,
                          out=args.out, seed=args.seed, sampler=args.sampler, device=args.device, ema=not args.no_ema,
                          **{k: v for k, v in (("prompt", args.prompt), ("temperature", args.temperature),
                                               ("top_k", args.top_k), ("complete", args.complete or None),
                                               ("attention", args.attention)) if v is not None})
    print(f"wrote {path}")
    return 0


def cmd_eval(args):
    from genlab.sample import evaluate_run
    metrics = [f"eval.metrics={args.metrics}"] if args.metrics is not None else []
    res = evaluate_run(args.run, overrides=list(args.overrides) + metrics, device=args.device)
    print(json.dumps(res, indent=2, default=str))
    return 0


def cmd_list(args):
    from genlab.config import CONFIG_DIR
    from genlab.registry import all_registries
    from genlab.sweep.spec import shipped_sweeps
    for kind, reg in all_registries().items():
        print(f"{kind}:")
        width = max([18] + [len(n) + 1 for n in reg.names()])
        for name in reg.names():
            print(f"  {name:<{width}} {reg.doc(name)}")
    files = {"presets:": sorted(CONFIG_DIR.glob("*.toml")),
             "sweeps (genlab sweep NAME):": [CONFIG_DIR / "sweeps" / f"{n}.toml" for n in shipped_sweeps()]}
    for title, paths in files.items():
        print(title)
        for p in paths:
            print(f"  {p.stem:<24} {_first_comment(p)}".rstrip())
    return 0


def _first_comment(path) -> str:
    """The first line of a preset's or sweep's leading comment: what it is for."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            return ""
    return ""


def cmd_config(args):
    from genlab.config import load_config
    from genlab.config_doc import annotated_toml, markdown
    if args.markdown:
        print(markdown(), end="")
        return 0
    preset, overrides = _split_config_and_overrides(args.items)
    print(annotated_toml(load_config(preset, overrides)), end="")
    return 0


def cmd_data(args):
    from genlab.data.convert import prepare
    out = prepare(args.kind, src=args.src, out=args.out, download=args.download, verify=not args.no_verify,
                  size=args.size, channels=args.channels, split=args.split, tokenizer=args.tokenizer, hf=args.hf)
    print(f"wrote {out}")
    return 0


def version() -> str:
    # the installed distribution's metadata; a source checkout on PYTHONPATH has none (or another copy's)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    import genlab
    try:
        return dist_version("genlab")
    except PackageNotFoundError:
        return genlab.__version__


def build_parser():
    p = argparse.ArgumentParser(prog="genlab", description="train and compare generative transformers")
    p.add_argument("--version", action="version", version=f"genlab {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a model: genlab train [CONFIG] [section.key=value ...]")
    t.add_argument("items", nargs="*", help="a preset name or .toml path, then dotted overrides")
    t.add_argument("--resume", help="run folder or checkpoint to continue from")
    t.set_defaults(fn=cmd_train)

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

    e = sub.add_parser("eval", help="evaluate a run or checkpoint (sample accuracy, FD, precision/recall, FID, LPIPS / likelihood bounds)")
    e.add_argument("run")
    e.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.num_samples=1000")
    e.add_argument("--device", default="auto")
    e.add_argument("--metrics", default=None, metavar="LIST",
                   help="image metrics, comma-separated: accuracy,fd,pr (default, offline), fid, lpips (need weights); "
                        "same as eval.metrics=LIST")
    e.set_defaults(fn=cmd_eval)

    lst = sub.add_parser("list", help="print every registry and its entries, the presets and the shipped sweeps")
    lst.set_defaults(fn=cmd_list)

    c = sub.add_parser("config", help="print the resolved config as TOML with each key's description and valid values")
    c.add_argument("items", nargs="*", help="a preset name or .toml path, then dotted overrides")
    c.add_argument("--markdown", action="store_true", help="the reference of every key as Markdown (docs/config.md)")
    c.set_defaults(fn=cmd_config)

    d = sub.add_parser("data", help="dataset tools")
    dsub = d.add_subparsers(dest="data_cmd", required=True)
    prep = dsub.add_parser("prepare", help="convert public files into genlab's memory-mapped format")
    prep.add_argument("kind", help="digits | mnist | fashion-mnist | cifar10 | imagefolder | frames | text")
    prep.add_argument("--src", default=None, help="folder (or file) holding the standard public files")
    prep.add_argument("--out", required=True, help="output folder (must not hold a dataset already)")
    prep.add_argument("--download", action="store_true", help="download the public files (needs internet)")
    prep.add_argument("--no-verify", action="store_true", help="skip the known-checksum check")
    prep.add_argument("--split", default="train", help="train | test (idx/pickle datasets)")
    prep.add_argument("--size", type=int, default=0, help="imagefolder: resize to SIZE x SIZE")
    prep.add_argument("--channels", type=int, default=3, help="imagefolder: 1 (grey) or 3 (RGB)")
    prep.add_argument("--tokenizer", default="char", help="text: char | byte | gpt2")
    prep.add_argument("--hf", default=None, help="text: a Hugging Face dataset name (needs internet)")
    prep.set_defaults(fn=cmd_data)
    from genlab.world.cli import add_data_commands
    add_data_commands(dsub)

    from genlab import cli_extra
    cli_extra.add_commands(sub)
    return p


def parse_args(argv=None):
    parser = build_parser()
    # section.key=value overrides may also follow options (`genlab eval RUN --metrics fd eval.num_samples=2000`):
    # argparse closes a nargs="*" positional at the first option, so collect the ones after it here
    args, extra = parser.parse_known_args(argv)
    if extra:
        slot = next((k for k in ("overrides", "items") if hasattr(args, k)), None)
        if slot is None or any(x.startswith("-") or "=" not in x for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, slot, list(getattr(args, slot) or []) + extra)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from genlab.errors import RunFailed, debug, one_line
    try:
        return args.fn(args)
    except RunFailed as e:
        print(f"genlab: failed: {e}", file=sys.stderr)
        return 1
    except GenlabError as e:
        print(f"genlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("genlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001
        from genlab.train.trainer import NonFiniteLoss
        if isinstance(e, NonFiniteLoss):
            print(f"genlab: diverged: {e}", file=sys.stderr)
            return 3
        if debug():
            raise
        # a bug or an unreadable input outside the trainer's setup: one line, the traceback on request
        print(f"genlab: error: {one_line(e)} (GENLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2
    except BaseException as e:  # e.g. torch's CheckpointException, which does not derive from Exception
        if isinstance(e, (SystemExit, GeneratorExit)) or debug():
            raise
        print(f"genlab: error: {one_line(e)} (GENLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

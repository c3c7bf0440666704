"""`genlab train [CONFIG] [section.key=value ...] [--resume RUN]` and the run summary it prints."""
from __future__ import annotations

from genlab.cli.commands import split_config_and_overrides
from genlab.core.errors import GenlabError

ORDER = 0
# a run stopped by SIGINT/SIGTERM saved its checkpoint and is not done: EX_TEMPFAIL (75), so a scheduler requeues it
# (`genlab train --resume RUN` continues exactly); 0 only for a finished run
EXIT_INTERRUPTED = 75


def cmd_train(args):
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer, config_for_resume
    preset, overrides = split_config_and_overrides(args.items)
    resume = args.resume or []
    if resume and preset:
        raise GenlabError("--resume takes the config saved with the run; give only key=value overrides")
    if len(resume) > 1:  # several seed/variant runs of one config, continued batched (train.seeds, train.lrs, ...)
        from genlab.training.seeds import SeedsTrainer
        return _exit_code(SeedsTrainer(resume=resume, overrides=overrides).fit())
    notes = []  # how the command line's config was fitted: printed and kept in config.toml once the run starts
    if resume:  # a resume keeps the run's schedule
        cfg = config_for_resume(resume[0], overrides)
    else:
        cfg = load_config(preset, overrides)
        notes = fit_warmup(cfg, preset, overrides)
    from genlab.config.check import batched_label, is_batched
    if is_batched(cfg):
        if resume:
            raise GenlabError(f"{batched_label(cfg)} with --resume: give every member's run, --resume NAME-s0 --resume NAME-s1 ...")
        from genlab.training.seeds import SeedsTrainer
        seeds = SeedsTrainer(cfg)
        for r in seeds.runs:
            r.notes = notes
        return _exit_code(seeds.fit())
    trainer = Trainer(cfg, resume=resume[0] if resume else None)
    trainer.notes = notes
    return _exit_code([trainer.fit()])


def fit_warmup(cfg, preset: str | None, overrides: list[str]) -> list[str]:
    """A warm-up that cannot end within train.steps never lets the LR reach its peak (docs/optimizers.md): the
    preset's warm-up under a train.steps override is scaled to its share of the preset's steps (returns the one-line
    note saying so); one set on the command line, or a preset's own misfit, is refused before any run folder exists."""
    from genlab.config.tree import load_config, parse_override
    from genlab.optim.schedules import scaled_warmup, warmup_limit
    o, steps = cfg.optim, cfg.train.steps
    limit = warmup_limit(steps, o)
    if o.warmup_steps <= limit:
        return []
    keys = {".".join(parse_override(x)[:2]) for x in overrides}
    if "optim.warmup_steps" in keys or "train.steps" not in keys:
        raise GenlabError(f"optim.warmup_steps={o.warmup_steps} does not fit train.steps={steps}: the {o.schedule} "
                          f"schedule's warm-up must end by step {limit}; set optim.warmup_steps <= {limit} or raise train.steps")
    base = load_config(preset)
    old, o.warmup_steps = o.warmup_steps, scaled_warmup(steps, o, base.optim.warmup_steps, base.train.steps)
    return [f"optim.warmup_steps {old} -> {o.warmup_steps} to fit train.steps={steps} ({cfg.preset}'s "
            f"{100 * old / base.train.steps:.3g}% of its {base.train.steps} steps); set optim.warmup_steps to choose"]


def _exit_code(summaries: list[dict]) -> int:
    """0 when every run finished; 75 when some stopped with a checkpoint (requeue); 1 otherwise."""
    import os
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank returns the summary; rank 0 prints it
        for s in summaries:
            print_summary(s)
    codes = [{"finished": 0, "interrupted": EXIT_INTERRUPTED}.get(s.get("status"), 1) for s in summaries]
    return 1 if 1 in codes else max(codes)


def print_summary(s: dict):
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)
    lines = [f"run: {s.get('run_dir')}  status: {s.get('status')}  steps: {s.get('step')}  wall: {fmt(s.get('wall_time'), '.1f')} s",
             f"final loss: {fmt(s.get('loss'), '.4f')}  throughput: {fmt(s.get('samples_per_s'), '.1f')} samples/s  "
             f"MFU: {'n/a' if s.get('mfu') is None else format(100 * s['mfu'], '.1f') + '%'}  "
             f"peak mem: {'n/a' if s.get('peak_mem_gib') is None else format(s['peak_mem_gib'], '.2f') + ' GiB'}"]
    if s.get("stalled"):  # training/stall.py: the run ended at the level of a predictor that ignores its input
        st = s["stall"]
        lines.append(f"stalled: {st['metric']} {st['value']:.4g} is still at the {st['what']} ({st['baseline']:.4g}) "
                     f"since step {st['since_step']}: the run learned nothing")
    if "eval_samples" in s:  # image metrics: every distance beside its real-vs-real floor
        from genlab.eval.metrics import summary_line
        lines.append(summary_line(s))
    for k, v in s.items():
        if k.startswith(("val_", "bpc", "ppl", "nelbo")) and isinstance(v, (int, float)):
            lines.append(f"{k}: {v:.4f}")
    if s.get("samples"):
        lines.append(f"samples: {s['samples']}")
    print("\n".join(lines))


def add_parser(sub):
    t = sub.add_parser("train", help="train a model: genlab train [CONFIG] [section.key=value ...]")
    t.add_argument("items", nargs="*", help="a preset name or .toml path, then dotted overrides")
    t.add_argument("--resume", action="append", metavar="RUN",
                   help="run folder or checkpoint to continue from; repeated: seed or variant runs of one config "
                        "(train.seeds, train.lrs, ...), continued batched")
    t.set_defaults(fn=cmd_train)

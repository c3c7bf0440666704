"""genlab command line: `genlab COMMAND ...` and --version. Each sub-command is one module of genlab.cli.commands,
found by listing that package; building the parser imports no torch (a bad command line is answered at once)."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from genlab.cli import commands
from genlab.core.errors import GenlabError, RunFailed, debug, machine_failure, one_line


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
    # every module of genlab.cli.commands, in the order `genlab --help` lists them (each module's ORDER)
    mods = [importlib.import_module(f"{commands.__name__}.{m.name}") for m in pkgutil.iter_modules(commands.__path__)]
    for mod in sorted(mods, key=lambda mod: mod.ORDER):
        mod.add_parser(sub)
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
    except BaseException as e:  # BaseException: torch's CheckpointException does not derive from Exception
        if isinstance(e, (SystemExit, GeneratorExit)):
            raise
        from genlab.training.trainer import NonFiniteLoss
        if isinstance(e, NonFiniteLoss):
            print(f"genlab: diverged: {e}", file=sys.stderr)
            return 3
        if debug():
            raise
        if machine_failure(e):  # a full disk or an I/O error is not bad input
            print(f"genlab: failed: {one_line(e)}", file=sys.stderr)
            return 1
        # a bug or an unreadable input outside the trainer's setup: one line, the traceback on request
        print(f"genlab: error: {one_line(e)} (GENLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

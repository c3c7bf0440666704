"""`genlab config [CONFIG] [key=value ...] [--markdown]`: the resolved config, each key with its description."""
from __future__ import annotations

from genlab.cli.commands import split_config_and_overrides

ORDER = 4


def cmd_config(args):
    from genlab.config.doc import annotated_toml, markdown
    from genlab.config.tree import load_config
    if args.markdown:
        print(markdown(), end="")
        return 0
    preset, overrides = split_config_and_overrides(args.items)
    print(annotated_toml(load_config(preset, overrides)), end="")
    return 0


def add_parser(sub):
    c = sub.add_parser("config", help="print the resolved config as TOML with each key's description and valid values")
    c.add_argument("items", nargs="*", help="a preset name or .toml path, then dotted overrides")
    c.add_argument("--markdown", action="store_true", help="the reference of every key as Markdown (docs/config.md)")
    c.set_defaults(fn=cmd_config)

"""One module per `genlab` sub-command. A module here is the whole command: `ORDER` (its place in
`genlab --help`), `add_parser(sub)` (its parser, built without torch) and the function it runs.
genlab.cli finds the modules by listing this package, so a new command is one new file."""
from __future__ import annotations

from genlab.core.errors import GenlabError


def split_config_and_overrides(items):
    """A command's positional ITEMS: one CONFIG (a preset name or .toml path), then key=value overrides."""
    preset, overrides = None, []
    for it in items:
        if "=" in it:
            overrides.append(it)
        elif preset is None:
            preset = it
        else:
            raise GenlabError(f"unexpected argument '{it}': give one CONFIG and then key=value overrides")
    return preset, overrides

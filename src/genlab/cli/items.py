"""A command's positional ITEMS: one CONFIG (a preset name or .toml path), then key=value overrides."""
from __future__ import annotations

from genlab.core.errors import GenlabError


def split_config_and_overrides(items):
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

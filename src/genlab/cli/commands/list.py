"""`genlab list`: every registry and its entries, the presets and the shipped sweeps, each with its one-line doc."""
from __future__ import annotations

import re

ORDER = 3


def cmd_list(args):
    from genlab.config.tree import CONFIG_DIR
    from genlab.core.registry import all_registries
    from genlab.lab.sweep.spec import shipped_sweeps
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
    """The first sentence of a preset's or sweep's leading comment (which may span lines): what it is for."""
    words = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        words.append(line.lstrip("# ").strip())
    text = " ".join(w for w in words if w)
    end = re.search(r"(?<! al)(?<! e\.g)(?<! i\.e)\.(\s|$)", text)  # "Frans et al. 2024" does not end it
    return text[:end.start() + 1] if end else text


def add_parser(sub):
    lst = sub.add_parser("list", help="print every registry and its entries, the presets and the shipped sweeps")
    lst.set_defaults(fn=cmd_list)

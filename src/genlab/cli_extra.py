"""Sub-commands that live in their own modules (bench, sweep); each adds its parser here."""


def add_commands(sub):
    for mod_name in ("genlab.bench_cli", "genlab.sweep", "genlab.export", "genlab.world.cli"):
        try:
            mod = __import__(mod_name, fromlist=["add_parser"])
        except ModuleNotFoundError as e:
            if e.name != mod_name:
                raise
            continue
        mod.add_parser(sub)

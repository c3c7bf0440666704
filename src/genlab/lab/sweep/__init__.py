"""Sweeps: vary one thing, keep the rest fixed, compare — one command, one table, a few plots.

    genlab sweep SWEEP.toml|NAME [key=value ...] [--dry-run] [--only NAME[,NAME]] [--retry-failed] [--max-time S] [--timeout S]
                 [--root sweeps]
    genlab sweep report DIR [--compare DIR2]

Modules: spec (read and validate the file), expand (axes -> variants; the size axes' widths come from
genlab.lab.match), runner (one process per run, skip/resume/failures), report (CSV, Markdown, HTML with plots).
The command line itself is genlab/cli/commands/sweep.py.
"""

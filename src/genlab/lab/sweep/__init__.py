"""Sweeps: vary one thing, keep the rest fixed, compare (docs/sweeps.md). spec reads and checks the file, expand
turns axes into variants, stages and tables handle [[stage]] entries, runner runs them, report writes the tables."""

"""The benchmark suite driver: `benchmarks/run.py --suite NAME` reads `benchmarks/suites/NAME.toml`.

spec.py reads and checks a suite file and expands its entries; execute.py runs them, each in its own process;
tables.py turns their results into the markdown tables that docs/benchmarks.md quotes.
"""

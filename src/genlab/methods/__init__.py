"""Methods own the objective, sampling, evaluation and their extra modules (methods/base.py: Method, StepContext,
Extra). Each module registers its entries; registry.load_entries finds them, so nothing here lists them."""

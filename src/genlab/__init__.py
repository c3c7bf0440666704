"""genlab: a fast, hackable PyTorch lab for training generative transformers."""
__version__ = "0.1.0"

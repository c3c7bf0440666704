"""genlab: a fast, hackable PyTorch lab for training generative transformers.

    import genlab
    cfg = genlab.load_config("digits_flow", {"train.steps": 200})   # or a list ["train.steps=200"]
    summary = genlab.train(cfg)                                      # the same loop as `genlab train`
    run = genlab.load_run(summary["run_dir"])                        # run folder, checkpoint or exported folder
    images = run.sample(n=16, class_id=3)                            # [16, C, H, W] in [-1, 1]

The API lives in genlab.runs.api and is imported on first use, so `import genlab` stays light (no torch).
"""
__version__ = "0.1.0"
__all__ = ["load_config", "train", "load_run", "Run", "__version__"]


def __getattr__(name):
    if name in ("load_config", "load_run", "Run", "train"):
        from genlab.runs import api  # lazy: `import genlab` stays light (no torch)
        return getattr(api, name)
    raise AttributeError(f"module 'genlab' has no attribute {name!r}")

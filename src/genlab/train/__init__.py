"""Training: the loop (trainer.py), parallelism, checkpoints, metrics.

This package is also the public `genlab.train(cfg)`. Python binds an imported subpackage as an attribute of
its parent, so a function named `train` in genlab/__init__.py would be replaced by this package as soon as
anything imports genlab.train.trainer; the package itself is made callable instead.
"""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, cfg=None, resume=None) -> dict:
        from genlab.train.seeds import train  # one run, or train.seeds batched
        return train(cfg, resume=resume)


sys.modules[__name__].__class__ = _CallablePackage

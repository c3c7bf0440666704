"""`run:RUN`: an autoencoder that genlab trained, loaded like every run (EMA weights where kept), scaled by the latent
std and shifted by the mean its evaluation measured (RUN/latent_stats.json; docs/latents.md).
"""
from __future__ import annotations

from pathlib import Path

from genlab.core.errors import GenlabError
from genlab.families.autoencoder.method import STATS_FILE, read_stats
from genlab.families.build import load_run
from genlab.families.models import model_registry
from genlab.nn.autoencoders import LatentCodec, autoencoder_registry
from genlab.runtime.checkpoint import resolve_checkpoint


def find_stats(arg: str) -> dict:
    p = Path(arg).expanduser()  # the run folder, or a checkpoint or exported file in it or one below
    for d in [p] if p.is_dir() and p.suffix != ".dcp" else [p.parent, p.parent.parent]:
        s = read_stats(d)
        if s is not None:
            return s
    raise GenlabError(f"autoencoder run:{arg}: no {STATS_FILE} with the latent std (its evaluation writes it: "
                      f"`genlab eval {arg}`, with eval.num_samples > 0)")


def check_run(arg: str) -> None:
    try:
        resolve_checkpoint(arg)
    except GenlabError as e:
        raise GenlabError(f"autoencoder run:{arg}: {e}") from None
    find_stats(arg)


class RunCodec(LatentCodec):
    def __init__(self, spec: str, model, channels: int, stats: dict, step: int):
        super().__init__(spec, channels=channels, latent_channels=model.latent_channels, factor=model.factor,
                         scale=1.0 / stats["latent_std"], shift=stats.get("latent_mean", 0.0))
        self.model, self.step, self.stats = model, step, stats

    def encode_raw(self, x):
        return self.model.encode(x)

    def decode_raw(self, z):
        return self.model.decode(z)

    def describe(self) -> dict:
        return {**super().describe(), "run_step": self.step,
                "latent_stats": {k: self.stats.get(k) for k in ("images", "source", "rec_l1", "psnr")}}


@autoencoder_registry.register("run", "an autoencoder genlab trained (method autoencoder): run folder or "
                                      "checkpoint; scale 1/std, shift mean of its latents", arg="RUN", check=check_run)
def build_run(arg, device):
    try:
        cfg, model, _, _, state = load_run(arg, device="cpu")
    except GenlabError as e:
        raise GenlabError(f"autoencoder run:{arg}: {e}") from None
    if model_registry.spec(cfg.model.name).family != "autoencoder":
        raise GenlabError(f"autoencoder run:{arg}: its model {cfg.model.name} is not an autoencoder "
                          f"(train one with method.name=autoencoder, e.g. `genlab train mnist_autoencoder`)")
    return RunCodec(f"run:{Path(arg).resolve()}", model, state["data_spec"]["channels"], find_stats(arg),  # absolute
                    int(state.get("step", 0)))

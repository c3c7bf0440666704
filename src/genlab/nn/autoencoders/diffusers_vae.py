"""`diffusers:PATH`: a diffusers `AutoencoderKL` from a local `save_pretrained` folder (config.json +
diffusion_pytorch_model.safetensors; docs/latents.md). Nothing is downloaded and loading runs no code: pickled weights
are refused. z = (mean - shift_factor) * scaling_factor as SD3/FLUX pipelines do; encode returns the posterior mean.
"""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.core.errors import GenlabError
from genlab.nn.autoencoders import LatentCodec, autoencoder_registry

WEIGHTS = "diffusion_pytorch_model.safetensors"
PICKLED = (".bin", ".ckpt", ".pt", ".pth")
INSTALL = 'pip install "genlab[vae]"'


def check_folder(arg: str) -> Path:
    """The folder holds a config and safetensors weights, and diffusers imports: one line otherwise."""
    p = Path(arg).expanduser()
    if not p.is_dir():
        raise GenlabError(f"autoencoder diffusers:{arg}: no such folder (expected what AutoencoderKL.save_pretrained "
                          f"writes: config.json + {WEIGHTS})")
    if not (p / "config.json").is_file():
        raise GenlabError(f"autoencoder diffusers:{arg}: no config.json in the folder")
    if not (p / WEIGHTS).is_file():
        pickled = sorted(f.name for f in p.iterdir() if f.suffix in PICKLED)
        if pickled:
            raise GenlabError(f"autoencoder diffusers:{arg}: refused {pickled[0]}: pickled weights can run code when "
                              f"loaded; genlab reads only {WEIGHTS} (save_pretrained(..., safe_serialization=True))")
        raise GenlabError(f"autoencoder diffusers:{arg}: no {WEIGHTS} in the folder")
    try:
        import diffusers  # noqa: F401
    except ImportError:
        raise GenlabError(f"autoencoder diffusers:PATH needs the diffusers package ({INSTALL})") from None
    return p


class DiffusersVAE(LatentCodec):
    def __init__(self, spec: str, vae):
        c = vae.config
        super().__init__(spec, channels=c.in_channels, latent_channels=c.latent_channels,
                         factor=2 ** (len(c.block_out_channels) - 1), scale=c.scaling_factor,
                         shift=getattr(c, "shift_factor", None) or 0.0)
        self.vae = vae

    def encode_raw(self, x):
        return self.vae.encode(x.to(self.vae.dtype)).latent_dist.mean.float()

    def posterior(self, x):
        """(mean, std) of the raw latent posterior of images x in [-1, 1]."""
        d = self.vae.encode(x.to(self.vae.dtype)).latent_dist
        return d.mean.float(), d.std.float()

    def decode_raw(self, z):
        return self.vae.decode(z.to(self.vae.dtype)).sample.float()


@autoencoder_registry.register("diffusers", "a diffusers AutoencoderKL folder (SD/SDXL/SD3 VAEs; config.json + "
                                            "safetensors weights), scale/shift from its config", arg="PATH",
                               check=check_folder)
def build_diffusers(arg, device):
    p = check_folder(arg)
    from diffusers import AutoencoderKL
    try:
        vae = AutoencoderKL.from_pretrained(str(p), use_safetensors=True, local_files_only=True,
                                            torch_dtype=torch.float32)
    except Exception as e:  # noqa: BLE001  (a config of another class, weights that do not fit it)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GenlabError(f"autoencoder diffusers:{arg}: cannot load it as an AutoencoderKL: {first}") from None
    return DiffusersVAE(f"diffusers:{Path(arg).resolve()}", vae)  # absolute: latents decode from any folder

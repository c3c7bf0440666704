"""The config tree: dataclasses with defaults, TOML presets and dotted `key=value` overrides.

A config fully determines a run. Unknown keys and wrong types fail before any work is done.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from genlab.config_fields import F, did_you_mean
from genlab.errors import GenlabError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # shipped as package data
SWEEP_DIR = CONFIG_DIR / "sweeps"


IMAGE_SETS = ("digits", "images", "synthetic")       # datasets whose samples are images
TOKEN_SETS = ("text", "tokens", "synthetic_tokens")  # datasets whose samples are token sequences
EMBEDDED = ("digits", "text")                        # need no files and no size options
LM_METHODS = ("autoregressive", "mdlm")
NOT_WORLD = ("flow", "image_ar") + LM_METHODS                   # methods that do not read the world-model options
NOT_T = LM_METHODS + ("image_ar",)                              # methods that draw no flow times t
FLOW_ONLY = NOT_T + ("world",)                                  # options only flow and repa read
IMAGE_BACKBONES = ("dit", "dit_incontext", "mmdit")              # class-conditional image models (models/dit.py)
NOT_IMAGE_BACKBONES = ("gpt", "sparse_transformer", "world_dit")
IMAGE_METRICS_UNUSED = ("image_ar", "world") + LM_METHODS       # methods that do not read eval.metrics and its options
NOT_MUON = ("adam", "adamw", "sgd", "shampoo", "mars", "soap", "psgd_kron", "adopt", "heavyball_adamw")  # optimizers without Muon groups
NOT_HEAVYBALL = ("adam", "adamw", "sgd", "shampoo", "mars", "adopt")  # optimizers not backed by heavyball
NOT_PRECONDITIONED = ("adam", "adamw", "sgd", "mars", "psgd_kron", "adopt", "muon", "heavyball_adamw")


@dataclass
class DataConfig:
    name: str = F("digits", "dataset to train on", registry="dataset")
    path: str = F("", "folder written by `genlab data prepare` (data.name=images|tokens)", free="a folder path",
                  unused={"data.name": EMBEDDED + ("synthetic", "synthetic_tokens")})
    split: str = F("train", "token data: the split the loader streams (val: the held-out tokens)", choices=("train", "val"),
                   unused={"data.name": IMAGE_SETS})
    on_device: str = F("auto", "keep the whole uint8 dataset resident on the device", choices=("auto", "yes", "no"))
    prefetch: int = F(2, "batches gathered ahead by the host loader thread (when not on device)", ge=0)
    pin_memory: str = F("auto", "pin host batches for asynchronous copies to the GPU", choices=("auto", "yes", "no"))
    image_size: int = F(32, "synthetic images: height = width in pixels", ge=1,
                        unused={"data.name": ("digits", "images") + TOKEN_SETS})
    channels: int = F(4, "synthetic images: channels", ge=1, unused={"data.name": ("digits", "images") + TOKEN_SETS})
    num_classes: int = F(1000, "synthetic images: number of classes", ge=1,
                         unused={"data.name": ("digits", "images") + TOKEN_SETS})
    size: int = F(4096, "synthetic data: number of samples (images or sequences)", ge=1,
                  unused={"data.name": ("digits", "images", "text", "tokens")})
    seq_len: int = F(256, "token data: sequence length per sample", ge=1, unused={"data.name": IMAGE_SETS})
    vocab_size: int = F(0, "synthetic tokens: vocabulary size (>= 2 for data.name=synthetic_tokens)", ge=0,
                        unused={"data.name": IMAGE_SETS + ("text", "tokens")})
    hflip: bool = F(False, "random horizontal flip of images, applied on the device", unused={"data.name": TOKEN_SETS})
    context_frames: int = F(4, "episodes: L past frames the world model conditions on", ge=1,
                            unused={"data.name": IMAGE_SETS + TOKEN_SETS})
    horizon: int = F(8, "episodes: frames after the context in a training window (the largest closed-loop horizon)", ge=1,
                     unused={"data.name": IMAGE_SETS + TOKEN_SETS})
    heldout: float = F(0.1, "episodes: fraction of episodes (the last ones) held out for evaluation", ge=0, lt=1,
                       unused={"data.name": IMAGE_SETS + TOKEN_SETS})


@dataclass
class ModelConfig:
    name: str = F("dit", "backbone", registry="model")
    size: str = F("tiny", "named size preset (dit: tiny small S B L XL; gpt: tiny small gpt2 gpt2-medium gpt2-large gpt2-xl)",
                  free="a size name of the chosen model")
    dim: int = F(0, "width (0 = from model.size)", ge=0)
    depth: int = F(0, "number of blocks (0 = from model.size)", ge=0)
    heads: int = F(0, "attention heads (0 = from model.size); must divide model.dim", ge=0)
    patch_size: int = F(2, "dit: patch side in pixels; must divide the image size", ge=1, unused={"model.name": ("gpt",)})
    mlp_ratio: float = F(4.0, "MLP hidden width / model width", gt=0)
    attention: str = F("sdpa", "attention kernel", registry="attention")
    class_dropout: float = F(0.1, "flow: label dropout that trains the null class for CFG", ge=0, le=1,
                             unused={"method.name": LM_METHODS})
    qk_norm: bool = F(False, "dit: normalise queries and keys per head", unused={"model.name": ("gpt",)})
    adaln: str = F("fused", "dit, mmdit: LayerNorm + adaLN modulation implementation", registry="adaln",
                   unused={"model.name": ("gpt", "dit_incontext")})
    residual: str = F("fp32", "dit: dtype of the residual stream under autocast", registry="residual",
                      unused={"model.name": ("gpt",)})
    dropout: float = F(0.0, "gpt: dropout after attention, MLP and embedding", ge=0, lt=1, unused={"model.name": IMAGE_BACKBONES})
    vocab_size: int = F(0, "gpt: embedding rows (0 = from the dataset)", ge=0, unused={"model.name": IMAGE_BACKBONES})
    pos_emb: str = F("auto", "position encoding (auto: dit sincos2d, gpt learned; 2-D entries for dit, 1-D for gpt)",
                     free="auto or a registry `position` entry that fits the model",
                     unused={"model.name": ("sparse_transformer", "world_dit")})
    norm: str = F("layernorm", "normalisation layer (dit: layernorm runs through model.adaln)", registry="norm",
                  unused={"model.name": ("sparse_transformer", "world_dit")})
    mlp: str = F("gelu", "MLP kind", registry="mlp", unused={"model.name": ("sparse_transformer", "world_dit")})
    long_skips: bool = F(False, "image backbones: U-ViT long skips, block depth-1-i input = Linear([x, output of block i])",
                         unused={"model.name": NOT_IMAGE_BACKBONES})
    ln_placement: str = F("pre", "dit_incontext: pre-LN (x + f(norm(x))) or post-LN (norm(x + f(x))) blocks",
                          choices=("pre", "post"), unused={"model.name": ("dit", "mmdit") + NOT_IMAGE_BACKBONES})
    dual_blocks: int = F(0, "mmdit: the first k blocks are dual-stream, the rest DiT blocks over the joint sequence "
                            "(0 = all dual: SD3's MMDiT)", ge=0,
                         unused={"model.name": ("dit", "dit_incontext") + NOT_IMAGE_BACKBONES})
    tie_weights: bool = F(True, "gpt: share the embedding with the output head", unused={"model.name": IMAGE_BACKBONES})
    causal: bool = F(True, "gpt: causal attention (autoregressive: true; mdlm: false)", unused={"model.name": IMAGE_BACKBONES})
    bias: bool = F(False, "gpt: biases in linears and norms", unused={"model.name": IMAGE_BACKBONES})
    context_mode: str = F("channels", "world_dit: context frames stacked on the target's channels, or as extra tokens",
                          choices=("channels", "tokens"), unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    ce_chunk: int = F(0, "gpt: > 0 = fused linear + cross-entropy over chunks of this many tokens (no logits kept)", ge=0,
                      unused={"model.name": IMAGE_BACKBONES})
    # sparse_transformer (image bytes, Child et al. 2019)
    raster: str = F("channel", "sparse_transformer: byte order, channel-major or pixel-major", choices=("channel", "pixel"),
                    unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_pattern: str = F("strided", "sparse_transformer: attention pattern", registry="sparse_pattern",
                            unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_mode: str = F("split", "sparse_transformer: factorization (parts across layers | union in one head | across heads)",
                         registry="sparse_mode", unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_stride: int = F(0, "sparse_transformer: stride / block length l (0 = one image row in the raster order)", ge=0,
                           unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_summary: int = F(0, "sparse_transformer: fixed pattern's summary cells c per block (0 = max(1, l // 8))", ge=0,
                            unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_summary_groups: int = F(1, "sparse_transformer: fixed pattern: the summary heads attend to this many distinct "
                                      "sub-blocks of c cells (the paper's section 4.2; groups * c <= l)", ge=1,
                                   unused={"model.name": IMAGE_BACKBONES + ("gpt", "world_dit")})
    sparse_backend: str = F("auto", "sparse_transformer: auto = flex on CUDA, blocked on CPU; flex = FlexAttention block "
                            "masks; blocked = unmasked SDPA on segments (runs, columns) where a part has them; dense = "
                            "masked SDPA (the reference)", choices=("auto", "blocked", "flex", "dense"),
                            unused={"model.name": IMAGE_BACKBONES + ("gpt",)})
    sparse_block: int = F(128, "sparse_transformer: FlexAttention block size, the unit of skipped work (32 | 64 | 128; "
                               "smaller blocks skip more of a thin pattern with smaller tiles and compile with max-autotune)",
                          choices=(32, 64, 128), unused={"model.name": IMAGE_BACKBONES + ("gpt", "world_dit")})
    sparse_embed: str = F("auto", "sparse_transformer: position embedding: data (row+column+channel, images) | attention "
                          "(row+column of the stride-wide matrix, the paper's text embedding) | auto (by data)",
                          choices=("auto", "data", "attention"), unused={"model.name": IMAGE_BACKBONES + ("gpt", "world_dit")})
    qk_ratio: float = F(1.0, "sparse_transformer: query/key width relative to model.dim (0.5 = the paper's halved q/k)",
                        gt=0, le=1, unused={"model.name": IMAGE_BACKBONES + ("gpt",)})


@dataclass
class MethodConfig:
    name: str = F("flow", "training objective and sampler", registry="method")
    timestep_sampler: str = F("logit_normal", "flow: distribution of training times t (t=0 noise, t=1 data)",
                              registry="timestep_sampler", unused={"method.name": LM_METHODS})
    logit_mean: float = F(0.0, "flow, logit_normal: mean of logit(t)", ge=-10, le=10, unused={"method.name": LM_METHODS})
    logit_std: float = F(1.0, "flow, logit_normal: standard deviation of logit(t)", gt=0, unused={"method.name": LM_METHODS})
    mode_scale: float = F(1.29, "flow, mode: SD3's s of f_mode (0 = uniform; > 0 favours mid t; monotone for -1..2/(pi-2))",
                          ge=-1, le=1.7519, unused={"method.name": NOT_T})
    lq_threshold: float = F(0.025, "flow, linear_quadratic (sampler or step schedule): t reached by the linear part (Mochi)",
                            gt=0, lt=1, unused={"method.name": NOT_T})
    lq_linear_frac: float = F(0.5, "flow, linear_quadratic: fraction of the steps (draws) in the linear part (Mochi)",
                              gt=0, lt=1, unused={"method.name": NOT_T})
    speed_tau: float = F(0.11, "flow, speed: t below which lies SpeeD's convergence area (0.11: the DDPM linear schedule's "
                               "boundary mapped by SNR)", gt=0, lt=1, unused={"method.name": NOT_T})
    speed_k: float = F(5.0, "flow, speed: density ratio of t >= speed_tau over t < speed_tau (SpeeD code: 2.5/0.5)", gt=0,
                       unused={"method.name": NOT_T})
    adaptive_bins: int = F(16, "flow, adaptive: bins of the learned categorical law of t", ge=2, unused={"method.name": FLOW_ONLY})
    adaptive_lr: float = F(0.1, "flow, adaptive: REINFORCE step size on the bin logits", ge=0, unused={"method.name": FLOW_ONLY})
    adaptive_every: int = F(10, "flow, adaptive: steps between sampler updates (that step's batch shares one bin)", ge=1,
                            unused={"method.name": FLOW_ONLY})
    adaptive_mix: float = F(0.1, "flow, adaptive: weight of the uniform law mixed into the learned one (exploration)", gt=0,
                            le=1, unused={"method.name": FLOW_ONLY})
    adaptive_entropy: float = F(1.0, "flow, adaptive: weight of the entropy bonus (a bin's logit settles near its mean "
                                     "standardised advantage / this)", ge=0, unused={"method.name": FLOW_ONLY})
    time_shift: float = F(1.0, "flow: SD3 resolution shift of training times, t/(s(1-t)+t) (1 = none, > 1 toward noise; "
                               "0 = sqrt(pixels / method.shift_base^2))", ge=0, unused={"method.name": FLOW_ONLY})
    shift_base: int = F(32, "flow, time_shift=0: side of the base image n of SD3's shift sqrt(m/n)", ge=1,
                        unused={"method.name": FLOW_ONLY})
    loss_weighting: str = F("none", "flow: per-sample weight w(t) of the velocity loss", registry="loss_weighting",
                            unused={"method.name": FLOW_ONLY})
    snr_gamma: float = F(5.0, "flow, min_snr: gamma of Min-SNR-gamma", gt=0, unused={"method.name": FLOW_ONLY})
    sampler: str = F("heun", "flow: ODE/SDE sampler", registry="sampler", unused={"method.name": LM_METHODS})
    step_schedule: str = F("uniform", "flow: grid of sampler times from noise (0) to data (1)", registry="step_schedule",
                           unused={"method.name": FLOW_ONLY})
    sample_shift: float = F(3.0, "flow, step_schedule=shifted: shift s of the grid t/(s(1-t)+t)", gt=0,
                            unused={"method.name": FLOW_ONLY})
    sde_noise: float = F(1.0, "flow, euler_maruyama: eta of the diffusion g(t)^2 = 2 eta (1-t) (0 = the ODE)", ge=0,
                         unused={"method.name": FLOW_ONLY})
    cfg_interval: str = F("0,1", "flow: guidance only for t in [lo, hi], conditional velocity elsewhere (Kynkaanniemi et al. "
                                 "2024; their EDM sigma interval (0.28, 5.42] is t = 1/(1+sigma) in [0.16, 0.78))",
                          free="two numbers 'lo,hi' with 0 <= lo < hi <= 1", unused={"method.name": FLOW_ONLY})
    sample_steps: int = F(20, "flow, mdlm: sampler steps for previews", ge=1, unused={"method.name": ("autoregressive",)})
    cfg_scale: float = F(2.0, "flow: classifier-free guidance scale for previews (1 = none)", ge=0,
                         unused={"method.name": LM_METHODS})
    noise_schedule: str = F("loglinear", "mdlm: masking schedule", choices=("loglinear", "cosine"),
                            unused={"method.name": ("flow", "autoregressive")})
    antithetic: bool = F(True, "mdlm: stratified (antithetic) training times", unused={"method.name": ("flow", "autoregressive")})
    eps: float = F(1e-3, "mdlm: smallest masking time", ge=0, lt=1, unused={"method.name": ("flow", "autoregressive")})
    temperature: float = F(1.0, "language models: sampling temperature (0 = greedy)", ge=0, unused={"method.name": ("flow",)})
    top_k: int = F(0, "autoregressive sampling: keep the k most likely tokens (0 = all)", ge=0,
                   unused={"method.name": ("flow", "mdlm")})
    sample_len: int = F(0, "tokens per text sample (0 = data.seq_len)", ge=0, unused={"method.name": ("flow",)})
    prompt: str = F("", "text prompt for previews; mdlm: \"[[N]]\" marks N tokens to infill", free="any text",
                    unused={"method.name": ("flow",)})
    block_len: int = F(0, "mdlm sampling: semi-autoregressive blocks of this many tokens (0 = one block)", ge=0,
                       unused={"method.name": ("flow", "autoregressive")})
    teacher: str = F("", "run folder or checkpoint of a frozen teacher, built from that run's own saved config",
                     free="a run folder or checkpoint path")
    repa_weight: float = F(0.5, "repa: lambda of the alignment term -cos(projector(h_k), encoder(x))", ge=0,
                           unused={"method.name": ("flow",) + LM_METHODS})
    repa_block: int = F(1, "repa: DiT block (1-based) whose output tokens are aligned", ge=1,
                        unused={"method.name": ("flow",) + LM_METHODS})
    repa_encoder: str = F("random", "repa: frozen encoder (classifier: the in-project feature CNN; random: a frozen random conv net)",
                          choices=("random", "classifier"), unused={"method.name": ("flow",) + LM_METHODS})
    repa_hidden: int = F(256, "repa: width of the trainable MLP projector", ge=1, unused={"method.name": ("flow",) + LM_METHODS})
    repa_lr: float = F(0.0, "repa: projector learning rate (0 = optim.lr)", ge=0, unused={"method.name": ("flow",) + LM_METHODS})
    objective: str = F("flow", "world: how the next-frame denoiser is trained and sampled", registry="world_objective",
                       unused={"method.name": NOT_WORLD})
    residual: bool = F(True, "world: diffuse target - last context frame (zero output = copy the last frame)",
                       unused={"method.name": NOT_WORLD})
    residual_scale: float = F(1.0, "world, residual: the diffused quantity is (target - last frame) * this", gt=0,
                              unused={"method.name": NOT_WORLD})
    prediction: str = F("x", "world, flow: the network outputs the clean frame (x; v is derived, the loss stays on v) or "
                             "v = data - noise (v: the net must cancel the noise itself, which leaks into static pixels)",
                        choices=("x", "v"), unused={"method.name": NOT_WORLD})
    sample_temperature: float = F(0.0, "world: scale of the starting noise when generating frames (rollouts, play, closed-loop "
                                        "contexts); 1 draws samples, 0 the deterministic frame from the noise mean, whose "
                                        "rollouts track the real frames best (PSNR)", ge=0, unused={"method.name": NOT_WORLD})
    quantize_frames: bool = F(True, "world: round generated frames to the 256 uint8 levels of real frames (rollouts, "
                                     "closed-loop contexts)", unused={"method.name": NOT_WORLD})
    ctx_noise_max: float = F(0.7, "world: context frames get Gaussian noise of level U(0, this), told to the model", ge=0,
                             unused={"method.name": NOT_WORLD})
    closed_loop_start: float = F(0.5, "world: fraction of training after which own rollouts fill the context (1 = never)",
                                 ge=0, le=1, unused={"method.name": NOT_WORLD})
    adv_weight: float = F(0.0, "world: weight of the adversarial term of a patch discriminator (0 = off)", ge=0,
                          unused={"method.name": NOT_WORLD})
    disc_lr: float = F(2e-4, "world: discriminator learning rate (method.adv_weight > 0)", gt=0,
                       unused={"method.name": NOT_WORLD})


@dataclass
class OptimConfig:
    name: str = F("adamw", "optimizer", registry="optimizer")
    lr: float = F(1e-3, "peak learning rate", gt=0)
    betas: tuple = F((0.9, 0.99), "Adam betas (sgd: betas[0] is the momentum)", ge=0, lt=1)
    weight_decay: float = F(0.0, "decoupled weight decay", ge=0)
    eps: float = F(1e-8, "Adam denominator epsilon", gt=0)
    schedule: str = F("cosine", "learning-rate schedule", registry="lr_schedule")
    warmup_steps: int = F(100, "linear warmup steps", ge=0)
    min_lr_ratio: float = F(0.1, "final lr / peak lr of the decaying schedules", ge=0, le=1)
    grad_clip: float = F(1.0, "clip the global gradient norm to this (0 = no clipping)", ge=0)
    caution: bool = F(False, "cautious updates (Liang et al. 2024) on any optimizer: the library's own where faithful, else genlab's wrapper")
    muon_scope: str = F("hidden", "muon: which matrices Muon updates (hidden: 2-D Linear weights in the blocks without adaLN; "
                        "hidden_adaln: with adaLN; all_2d: every ndim>=2 param); the rest use AdamW",
                        choices=("hidden", "hidden_adaln", "all_2d"), unused={"optim.name": NOT_MUON})
    precondition_every: int = F(0, "shampoo/soap: recompute the preconditioner every this many steps (0 = 10)", ge=0,
                                unused={"optim.name": NOT_PRECONDITIONED})
    heavyball_compile: str = F("max-autotune-no-cudagraphs", "heavyball optimizers on CUDA: torch.compile mode of their "
                               "fused step (the library's default autotunes for minutes; off = eager; CPU is always eager)",
                               choices=("max-autotune-no-cudagraphs", "default", "off"), unused={"optim.name": NOT_HEAVYBALL})
    decay_frac: float = F(0.2, "wsd: fraction of the steps in the final decay", gt=0, le=1,
                          unused={"optim.schedule": ("cosine", "constant", "linear")})
    decay_shape: str = F("1-sqrt", "wsd: shape of the final decay (Hägele et al. 2024)", choices=("linear", "1-sqrt"),
                         unused={"optim.schedule": ("cosine", "constant", "linear")})


@dataclass
class TrainConfig:
    steps: int = F(2000, "optimizer steps", ge=1)
    batch_size: int = F(128, "global batch (summed over micro-steps and ranks)", ge=1)
    grad_accum: int = F(1, "micro-steps per optimizer step; must divide train.batch_size", ge=1)
    device: str = F("auto", "auto | cpu | cuda | cuda:N", free="auto, cpu, cuda or cuda:N")
    precision: str = F("auto", "numeric precision (auto = bf16 on CUDA, fp32 on CPU)", registry="precision")
    compile: str = F("off", "what torch.compile wraps", registry="compile")
    compile_mode: str = F("default", "the torch.compile mode", registry="compile_mode")
    activation_checkpointing: str = F("none", "recompute activations in the backward pass", registry="activation_checkpointing")
    ac_every: int = F(2, "activation_checkpointing=every_k: recompute every k-th block; =segments: the number of segments", ge=1)
    parallel: str = F("auto", "data parallelism", registry="parallel")
    replicate: int = F(0, "HSDP replicate degree (0 = world / shard)", ge=0)
    shard: int = F(0, "HSDP/FSDP shard degree (0 = all ranks)", ge=0)
    fsdp_prefetch: int = F(1, "FSDP/HSDP: explicit prefetch of this many blocks ahead (0 = implicit only)", ge=0)
    fsdp_keep_last: int = F(1, "FSDP/HSDP: last blocks left unsharded after the forward", ge=0)
    compiled_autograd: bool = F(False, "trace the backward with compiled autograd (use with compile=model|blocks)")
    compile_optimizer: bool = F(False, "torch.compile the optimizer step (torch adamw/adam/sgd; LR kept in a tensor)")
    seed: int = F(0, "seed of data order, init and noise", ge=0)
    ema_decay: float = F(0.999, "EMA decay of the sampling weights (0 = no EMA)", ge=0, lt=1)
    ema_warmup: bool = F(True, "decay min(ema_decay, (1+n)/(10+n)) so early EMA tracks the model")
    skip_nonfinite: bool = F(False, "skip (and count) steps with a non-finite loss instead of stopping")
    name: str = F("", "run name (default: preset name + timestamp)", free="a folder name")
    out_dir: str = F("runs", "folder that holds the run folders", free="a folder path")
    resume: str = F("", "run folder or checkpoint to continue from", free="a run folder or checkpoint path")
    init_from: str = F("", "start from these weights (run folder, checkpoint or exported model.safetensors; strict shapes)",
                       free="a run folder, checkpoint or .safetensors path")
    convert: list = F([], "model converters applied before wrapping and when sample/eval/export load the run", registry="convert")


@dataclass
class LogConfig:
    every: int = F(50, "steps between metric lines (the only host syncs in the loop)", ge=1)
    tensorboard: bool = F(True, "write TensorBoard event files")
    progress: bool = F(True, "console: a status line every log.every steps and eval/sampling progress (a tqdm bar only on a terminal)")
    ckpt_every: int = F(500, "steps between checkpoints (0 = only at the end)", ge=0)
    keep_last: int = F(3, "checkpoints kept (0 = all)", ge=0)
    keep_best: bool = F(False, "also keep checkpoints/best.pt: the lowest validation metric seen")
    sample_every: int = F(0, "steps between sample previews (0 = only at the end)", ge=0)
    eval_every: int = F(0, "steps between evaluations (0 = only at the end)", ge=0)
    wandb: bool = F(False, 'also log to Weights & Biases (pip install "genlab[wandb]"; WANDB_MODE=offline works)')
    wandb_project: str = F("genlab", "W&B project of the run (the W&B run is named after the run folder)",
                           free="a W&B project name")


@dataclass
class EvalConfig:
    num_samples: int = F(500, "samples for sample accuracy / feature distance / validation windows (0 = no eval)", ge=0)
    sample_steps: int = F(20, "flow: sampler steps in evaluation", ge=1, unused={"method.name": LM_METHODS})
    cfg_scale: float = F(2.0, "flow: guidance scale in evaluation", ge=0, unused={"method.name": LM_METHODS})
    classifier_epochs: int = F(30, "flow: epochs of the in-project feature classifier", ge=1, unused={"method.name": LM_METHODS})
    batch_size: int = F(250, "evaluation batch size", ge=1)
    grid_per_class: int = F(10, "flow: columns of the sample grid", ge=1, unused={"method.name": LM_METHODS})
    T_list: str = F("8,32,128,512,1000", "mdlm: step counts T of the bound-vs-T table (plus T=inf)",
                    free="comma-separated integers >= 1", unused={"method.name": ("flow", "autoregressive")})
    nelbo_reps: int = F(2, "mdlm: Monte Carlo draws per validation sequence for the NELBO", ge=1,
                        unused={"method.name": ("flow", "autoregressive")})
    gen_ppl_model: str = F("", "mdlm: autoregressive run that scores samples (generative perplexity)",
                           free="a run folder", unused={"method.name": ("flow", "autoregressive")})
    gen_samples: int = F(16, "mdlm: samples scored for the generative perplexity", ge=1,
                         unused={"method.name": ("flow", "autoregressive")})
    val_path: str = F("", "held-out images folder, e.g. the test split (flow: reference of FD/FID/precision-recall and the "
                      "real-vs-real floor, empty: a fixed half of the training images; image_ar: bits/dim, empty: the last "
                      "eval.num_samples training images)",
                      free="a folder made by `genlab data prepare`", unused={"method.name": ("autoregressive", "mdlm")})
    metrics: str = F("accuracy,fd,pr", "flow: image metrics of each evaluation (fid and lpips need downloaded weights; README: Evaluation metrics)",
                     free="comma-separated names of registry `eval_metric`: accuracy, fd, fid, lpips, pr",
                     unused={"method.name": IMAGE_METRICS_UNUSED})
    ref_samples: int = F(10000, "flow: held-out images in the reference set of FD/FID (at most the held-out split)", ge=2,
                         unused={"method.name": IMAGE_METRICS_UNUSED})
    pr_k: int = F(3, "flow: k of the k-NN manifolds of precision/recall (Kynkäänniemi et al. 2019)", ge=1,
                  unused={"method.name": IMAGE_METRICS_UNUSED})
    fid_weights: str = F("", "flow: FID Inception weights pt_inception-2015-12-05-6726825d.pth, a file or its folder "
                         "(empty: $GENLAB_FID_WEIGHTS, then $TORCH_HOME/hub/checkpoints)",
                         free="a file or folder path", unused={"method.name": IMAGE_METRICS_UNUSED})
    lpips_net: str = F("alex", "flow: LPIPS backbone (v0.1 linear layers)", choices=("alex", "vgg"),
                       unused={"method.name": IMAGE_METRICS_UNUSED})
    lpips_weights: str = F("", "flow: folder with the LPIPS files (alexnet-owt-7be5be79.pth or vgg16-397923af.pth + alex.pth "
                           "or vgg.pth; empty: $GENLAB_LPIPS_WEIGHTS, then $TORCH_HOME/hub/checkpoints)",
                           free="a folder path", unused={"method.name": IMAGE_METRICS_UNUSED})
    lpips_pairs: int = F(500, "flow: same-class sample pairs averaged by the LPIPS diversity", ge=1,
                         unused={"method.name": IMAGE_METRICS_UNUSED})
    nfe_list: str = F("", "flow, genlab eval: also a table of sample accuracy / feature FD at these NFEs (velocity "
                          "evaluations per sample; empty = off)", free="comma-separated integers >= 1",
                      unused={"method.name": FLOW_ONLY})
    samplers: str = F("", "flow, genlab eval with eval.nfe_list: samplers of the table (empty = method.sampler)",
                      free="comma-separated names of registry `sampler`", unused={"method.name": FLOW_ONLY})
    world_rollouts: int = F(32, "world: held-out windows per rollout evaluation", ge=1, unused={"method.name": NOT_WORLD})
    world_horizons: str = F("16,32", "world: rollout lengths evaluated (per-step PSNR vs copy-last)",
                            free="comma-separated integers >= 1", unused={"method.name": NOT_WORLD})


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    preset: str = F("default", "name of the preset the config started from", free="a preset name")


def _coerce(value: Any, typ, where: str):
    """Check/convert a TOML or CLI value to the declared field type."""
    origin = get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif typ is list:  # a list of names: TOML array, JSON text or comma-separated text
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v.strip() for v in value.strip("()[]").split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
    elif typ is tuple or origin is tuple:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v for v in value.strip("()[]").split(",") if v.strip()]
        if isinstance(value, (list, tuple)):
            try:
                return tuple(float(v) for v in value)
            except (TypeError, ValueError):
                pass
    name = getattr(typ, "__name__", str(typ))
    raise GenlabError(f"config key '{where}' expects {name}, got {value!r}")


def _section_types(section_cls):
    return get_type_hints(section_cls)


def apply_dict(cfg: Config, data: dict, source: str = "config") -> Config:
    """Merge a nested dict (from TOML) into cfg, validating every key and type."""
    top = _section_types(Config)
    for key, val in data.items():
        if key not in top:
            raise GenlabError(f"unknown config section '{key}' in {source}{did_you_mean(key, top)}; valid: {', '.join(top)}")
        if key == "preset":
            cfg.preset = _coerce(val, str, key)
            continue
        if not isinstance(val, dict):
            raise GenlabError(f"config section '{key}' in {source} must be a table")
        section = getattr(cfg, key)
        types = _section_types(type(section))
        for k, v in val.items():
            if k not in types:
                raise GenlabError(f"unknown config key '{key}.{k}' in {source}{did_you_mean(k, types)}; "
                                  f"valid keys of [{key}]: {', '.join(types)}")
            setattr(section, k, _coerce(v, types[k], f"{key}.{k}"))
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
    if "=" not in text:
        raise GenlabError(f"override '{text}' must look like section.key=value (e.g. optim.lr=3e-4)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2:
        raise GenlabError(f"override key '{key}' must be section.key (e.g. model.depth=12)")
    return parts[0], parts[1], raw.strip()


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for text in overrides:
        section, key, raw = parse_override(text)
        apply_dict(cfg, {section: {key: raw}}, source=f"override '{text}'")
    return cfg


def resolve_preset_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return p
    for cand in (CONFIG_DIR / name_or_path, CONFIG_DIR / f"{name_or_path}.toml"):
        if cand.exists():
            return cand
    presets = sorted(x.stem for x in CONFIG_DIR.glob("*.toml"))
    raise GenlabError(f"config '{name_or_path}' not found; presets: {', '.join(presets)} (or a path to a .toml file)")


def load_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise GenlabError(f"{path}: invalid TOML: {e}") from None


def load_config(preset: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- preset TOML <- overrides. `preset` None means the default preset."""
    cfg = Config()
    path = resolve_preset_path(preset or "digits_flow")
    cfg.preset = path.stem
    apply_dict(cfg, load_toml(path), source=str(path))
    apply_overrides(cfg, list(overrides))
    validate(cfg)
    return cfg


def sections(cfg: Config | None = None):
    """(section name, dataclass type or instance) for every table of the config."""
    cfg = cfg if cfg is not None else Config()
    return [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(cfg, f.name))]


def validate(cfg: Config) -> None:
    """Every field against its declared range/choices/registry, options the chosen components do not
    read, then the constraints model, data and method impose on each other: before anything is built."""
    from genlab.config_check import check_config
    check_config(cfg)


def to_dict(cfg: Config) -> dict:
    d = dataclasses.asdict(cfg)
    for sec in d.values():
        if isinstance(sec, dict):
            for k, v in sec.items():
                if isinstance(v, tuple):
                    sec[k] = list(v)
    return d


def from_dict(d: dict) -> Config:
    cfg = Config()
    apply_dict(cfg, d, source="saved config")
    return cfg


def dumps_toml(d: dict) -> str:
    """The config dict as TOML, written by tomli-w (tomllib only reads)."""
    import tomli_w
    return tomli_w.dumps(d)

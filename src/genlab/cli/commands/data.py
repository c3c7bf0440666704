"""`genlab data prepare|encode|generate|collect|import|stats|ref-stats`: convert public files, encode them to
autoencoder latents, draw teacher pairs, collect or import game episodes, inspect them, write FID reference statistics."""
from __future__ import annotations

import json

from genlab.core.errors import GenlabError

ORDER = 5


def cmd_prepare(args):
    from genlab.data.convert import prepare
    out = prepare(args.kind, src=args.src, out=args.out, download=args.download, verify=not args.no_verify,
                  size=args.size, channels=args.channels, split=args.split, tokenizer=args.tokenizer, hf=args.hf,
                  shard_size=args.shard_size, workers=args.workers, force=args.force)
    print(f"wrote {out}")
    return 0


def cmd_encode(args):
    from genlab.data.encode import encode_dataset
    out = encode_dataset(args.dataset, args.vae, args.out, batch_size=args.batch_size, flip=not args.no_flip,
                         device=args.device, dtype=args.dtype, force=args.force, precision=args.precision,
                         channels_last=args.channels_last, compile=args.compile)
    import os
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {out}")
    return 0


def cmd_generate(args):
    from genlab.families.few_step.generate_pairs import generate_pairs
    if args.kind != "pairs":
        raise GenlabError(f"unknown generate kind '{args.kind}'; valid choices: pairs")
    out = generate_pairs(args.run, args.out, args.n, steps=args.steps, sampler=args.sampler, cfg_scale=args.cfg_scale,
                         batch=args.batch, seed=args.seed, device=args.device)
    print(f"wrote {out}")
    return 0


def cmd_collect(args):
    if args.source == "vizdoom":
        from genlab.families.world.vizdoom import collect_vizdoom
        path = collect_vizdoom(args.scenario, args.frames, args.out, policy=args.policy or "explorer", actions=args.actions,
                               size=args.size, channels=args.channels, workers=args.workers, seed=args.seed,
                               max_episode=args.max_episode, doom_map=args.map, turn=args.turn, skip=args.skip)
    elif args.source == "atari":
        from genlab.families.world.collect import collect_atari
        path = collect_atari(args.game, args.frames, args.out, policy=args.policy or "random", size=args.size,
                             channels=args.channels, workers=args.workers, seed=args.seed, max_episode=args.max_episode,
                             explore=args.explore)
    else:
        raise GenlabError(f"unknown collection source '{args.source}'; valid choices: atari, vizdoom")
    print(f"wrote {path}")
    return 0


def cmd_import(args):
    from genlab.families.world.tools import import_episodes
    if args.kind != "episodes":
        raise GenlabError(f"unknown import kind '{args.kind}'; valid choices: episodes")
    res = import_episodes(args.frames, args.actions, args.out, starts=args.episode_starts, size=args.size)
    print(f"wrote {res['path']}")
    return 0 if res["ok"] else 1


def cmd_stats(args):
    from genlab.families.world.tools import episode_stats
    res = episode_stats(args.dir, sheet=args.sheet)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


def cmd_ref_stats(args):
    from genlab.eval.ref_stats import reference_from_dataset
    from genlab.runtime.parallel import resolve_device
    out = reference_from_dataset(args.dataset, args.out, fid_weights=args.fid_weights, n_images=args.images,
                                 limit=args.limit, batch=args.batch, device=resolve_device(args.device, key="--device"))
    print(f"wrote {out}")
    return 0


def add_parser(sub):
    d = sub.add_parser("data", help="dataset tools")
    dsub = d.add_subparsers(dest="data_cmd", required=True)
    prep = dsub.add_parser("prepare", help="convert public files into genlab's memory-mapped format")
    prep.add_argument("kind", help="digits | mnist | fashion-mnist | cifar10 | imagefolder | frames | text | shards")
    prep.add_argument("--src", default=None, nargs="+",
                      help="folder (or file) holding the standard public files; text: one or more files, folders or "
                           "glob patterns (.txt/.md: one text joined by newlines; .jsonl: documents with a \"text\" field)")
    prep.add_argument("--out", required=True, help="output folder (must not hold a dataset already)")
    prep.add_argument("--download", action="store_true", help="download the public files (needs internet)")
    prep.add_argument("--no-verify", action="store_true", help="skip the known-checksum check")
    prep.add_argument("--split", default="train", help="train | test (idx/pickle datasets)")
    prep.add_argument("--size", type=int, default=0, help="imagefolder, shards: resize to SIZE x SIZE")
    prep.add_argument("--channels", type=int, default=3, help="imagefolder, shards: 1 (grey) or 3 (RGB)")
    prep.add_argument("--shard-size", dest="shard_size", type=int, default=1000,
                      help="shards: images per shard file (--src: a class folder or a .csv/.json list of path,label)")
    prep.add_argument("--workers", type=int, default=0, help="shards, text: conversion processes (0 = one per core; "
                                                                  "text with byte/char: 1, numpy outruns the pipes)")
    prep.add_argument("--force", action="store_true", help="text: replace an existing token dataset at --out "
                                                           "(only once the new one is complete)")
    prep.add_argument("--tokenizer", default="char", help="text: char | byte | gpt2")
    prep.add_argument("--hf", default=None, help="text: a Hugging Face dataset name (needs internet)")
    prep.set_defaults(fn=cmd_prepare)
    e = dsub.add_parser("encode", help="precompute autoencoder latents of a prepared image set (data.name=latents); "
                                       "resumable, one or many GPUs (torchrun)")
    e.add_argument("dataset", help="a folder written by `genlab data prepare` (image array or shards)")
    e.add_argument("--vae", required=True, help="autoencoder NAME:ARG, e.g. unshuffle:2 (`genlab list autoencoder`)")
    e.add_argument("--out", required=True, help="output folder (work goes to OUT.partial; rerun to resume)")
    e.add_argument("--batch-size", dest="batch_size", type=int, default=64,
                   help="images per encoder call, also the unit of resume (default: 64)")
    e.add_argument("--no-flip", dest="no_flip", action="store_true",
                   help="store no horizontally flipped variant (data.hflip=true then refuses these latents)")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (under torchrun: each rank's GPU)")
    e.add_argument("--dtype", default="float16", choices=("float16", "float32"), help="stored latent dtype (default: float16)")
    e.add_argument("--precision", default="fp32",
                   help="the encoder's arithmetic: fp32 (IEEE, default) | tf32 | bf16 | fp16 (autocast), as train.precision")
    e.add_argument("--channels-last", dest="channels_last", action="store_true",
                   help="run the encoder in NHWC memory layout (convolutional autoencoders on tensor cores)")
    e.add_argument("--compile", action="store_true", help="torch.compile the encoder (one compile per batch shape)")
    e.add_argument("--force", action="store_true", help="replace a finished OUT or an unfinished OUT.partial")
    e.set_defaults(fn=cmd_encode)
    g = dsub.add_parser("generate", help="draw (noise, image, label) pairs with a trained flow run's ODE sampler "
                                         "(reflow's data)")
    g.add_argument("kind", help="pairs")
    g.add_argument("run", help="a velocity-predicting run (flow, REPA): run folder, checkpoint or model.safetensors")
    g.add_argument("--out", required=True, help="output folder (must not exist)")
    g.add_argument("--n", type=int, default=50000, help="number of pairs")
    g.add_argument("--steps", type=int, default=None, help="sampler steps (default: the run's eval.sample_steps)")
    g.add_argument("--sampler", default=None, help="a deterministic ODE sampler (default: the run's method.sampler "
                                                   "if it is one, else heun)")
    g.add_argument("--cfg-scale", dest="cfg_scale", type=float, default=None,
                   help="guidance scale (default: the run's eval.cfg_scale)")
    g.add_argument("--batch", type=int, default=256, help="images per sampler call")
    g.add_argument("--seed", type=int, default=0, help="seed of the noise and the label order")
    g.add_argument("--device", default="auto")
    g.set_defaults(fn=cmd_generate)
    c = dsub.add_parser("collect", help="collect game frames + actions into an episode folder (Atari: gymnasium + ale-py; "
                        "first-person 3D: vizdoom)")
    c.add_argument("source", help="atari | vizdoom")
    c.add_argument("--game", default="Pong", help="atari: any ALE game name, e.g. Pong, Breakout, MsPacman")
    c.add_argument("--scenario", default="my_way_home", help="vizdoom: a scenario shipped in the wheel, e.g. my_way_home, freedoom2")
    c.add_argument("--map", default=None, help="vizdoom: the map of the scenario's WAD, e.g. MAP02 (default: the scenario's)")
    c.add_argument("--actions", default="discrete", help="vizdoom: discrete (11 named actions) | continuous "
                   "([move, strafe, turn degrees, attack, use] per frame)")
    c.add_argument("--turn", type=float, default=12.0, help="vizdoom: degrees a turn action turns per frame")
    c.add_argument("--skip", type=int, default=4, help="vizdoom: game tics per frame (frame skip)")
    c.add_argument("--frames", type=int, default=10000)
    c.add_argument("--policy", default=None, help="atari: random (default) | sticky (repeats its last action with p=0.8) | "
                   "tracker (Pong, Breakout: moves its paddle toward the ball, with sticky random stretches); "
                   "vizdoom: explorer (default: held moves, unsticks itself) | random")
    c.add_argument("--explore", type=float, default=0.25, help="atari tracker: share of frames in sticky random stretches")
    c.add_argument("--size", type=int, default=64, help="frames resized to SIZE x SIZE")
    c.add_argument("--channels", type=int, default=3, help="3 (RGB) or 1 (grey)")
    c.add_argument("--workers", type=int, default=0, help="processes (0 = one per core, up to frames/2000)")
    c.add_argument("--max-episode", dest="max_episode", type=int, default=1000, help="cut episodes at this many frames (>= 2)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True)
    c.set_defaults(fn=cmd_collect)
    i = dsub.add_parser("import", help="import your own recordings (frames + control file) with an alignment check")
    i.add_argument("kind", help="episodes")
    i.add_argument("--frames", required=True, help="a folder of images (sorted by name) or a uint8 .npy [T,H,W,C]")
    i.add_argument("--actions", required=True, help=".npy / .csv / .txt: one row per frame (ints = discrete, else vectors)")
    i.add_argument("--episode-starts", dest="episode_starts", default=None, help="file of episode start frame indices")
    i.add_argument("--size", type=int, default=0, help="resize image frames to SIZE x SIZE")
    i.add_argument("--out", required=True)
    i.set_defaults(fn=cmd_import)
    s = dsub.add_parser("stats", help="frames, episodes, action histogram and coverage, contact sheet of an episode folder")
    s.add_argument("dir")
    s.add_argument("--sheet", default=None, help="contact sheet PNG (default DIR/contact_sheet.png)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stats)
    r = dsub.add_parser("ref-stats", help="FID reference statistics of an image dataset (ADM .npz layout: mu, sigma, "
                                          "mu_s, sigma_s, arr_0) for eval.fid_ref")
    r.add_argument("dataset", help="a folder made by `genlab data prepare` (uint8 images, 1 or 3 channels)")
    r.add_argument("--out", required=True, help="the .npz to write (must not exist)")
    r.add_argument("--fid-weights", dest="fid_weights", default="",
                   help="pt_inception-2015-12-05-6726825d.pth or its folder (default: $GENLAB_FID_WEIGHTS, then torch hub)")
    r.add_argument("--images", type=int, default=10000,
                   help="images stored as arr_0 for precision/recall (a fixed random subset; ADM stores 10,000; 0 = none)")
    r.add_argument("--limit", type=int, default=0, help="statistics of the first LIMIT images only (0 = all)")
    r.add_argument("--batch", type=int, default=100, help="images per Inception forward")
    r.add_argument("--device", default="auto")
    r.set_defaults(fn=cmd_ref_stats)

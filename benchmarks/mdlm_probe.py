"""What separates an MDLM seed that learns from one that stalls (issue 55): the trainer's own step (TrainStep, as
`genlab train` runs it, compiled or not) with diagnostics read between steps, never inside the compiled graph.

    python benchmarks/mdlm_probe.py --seeds 0,1,2,3,4,5 --steps 2000 --label recipe --out DIR [key=value ...]

Per run DIR/<label>-s<seed>.jsonl holds, per recorded step: the loss, the pre-clip gradient norm, the lr, the share
of masked tokens in that step's batch (the method's own draws, replayed from a copy of its generator), the relative
update size ||dW|| / ||W|| of every parameter group, and every few hundred steps the attention entropy per layer and
the attention mass on the two neighbours (+-1) on a fixed masked validation batch. A table of the runs ends the output.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.config.tree import load_config
from genlab.core.tables import markdown_table
from genlab.data import build_dataset, build_loader
from genlab.families.lm.mdlm import alpha, antithetic_uniform
from genlab.runtime.parallel import init_distributed
from genlab.runtime.switches import build_precision
from genlab.training.step import TrainStep


def group_of(name: str) -> str:
    """Parameter name -> its layer group (blocks.3.attn.qkv.weight -> b3.attn.qkv)."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return "b" + parts[1] + "." + ".".join(p for p in parts[2:] if p not in ("weight", "bias"))
    return parts[0]


@torch.no_grad()
def attention_stats(model, z) -> list[dict]:
    """Per block: mean attention entropy (nats) and the mean attention mass on positions i-1 and i+1."""
    h = model.pos_emb(model.tok_emb(z))
    rope = model.pos_emb.rope()
    L = z.shape[1]
    i = torch.arange(L, device=z.device)
    near = ((i[:, None] - i[None, :]).abs() == 1).float()
    out = []
    for block in model.blocks:
        q, k, _ = block.attn.heads_qkv(block.norm1(h), rope)
        p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1]), -1)
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1).mean().item()
        out.append({"entropy": round(ent, 4), "near": round((p * near).sum(-1).mean().item(), 4)})
        h = block(h, rope=rope)
    return out


def masked_share(st, x_shape, eps, schedule, antithetic) -> float:
    """The share of masked tokens in the coming step: the method's first two draws from a copy of its generator."""
    g = torch.Generator(device=st.gen.device)
    g.set_state(st.gen.get_state())
    t = (eps + (1 - eps) * antithetic_uniform(x_shape[0], g, st.gen.device, antithetic)).clamp_min(1e-6)
    u = torch.rand(x_shape, generator=g, device=st.gen.device)
    return (u < (1 - alpha(t, schedule, eps))[:, None]).float().mean().item()


def probe(preset: str, seed: int, steps: int, overrides: list[str], out: Path, label: str) -> dict:
    cfg = load_config(preset, [f"train.seed={seed}", *overrides])
    dist, device = init_distributed(cfg.train.device)
    precision = build_precision(cfg.train.precision, device)
    torch.manual_seed(cfg.train.seed)  # as the trainer: the model is built under the run's seed
    data = build_dataset(cfg.data)
    st = TrainStep(cfg, data.spec, dist, device, precision)
    torch.manual_seed(cfg.train.seed)
    loader = build_loader(data, cfg.data, cfg.train.batch_size, device, cfg.train.seed)
    model, m = st.model, cfg.method
    shape = (cfg.train.batch_size, data.spec["seq_len"])
    g = torch.Generator(device=device).manual_seed(12345)  # the fixed probe batch: 32 validation windows at t = 0.5
    vx = build_loader(data, cfg.data, 32, device, 999).next()["x"].clone()  # its own loader: the run's order stays
    vz = torch.where(torch.rand(vx.shape, generator=g, device=device) < 0.5, torch.full_like(vx, model.mask_id), vx)
    names = list(model.named_parameters())
    losses, t0 = [], time.time()
    with open(out / f"{label}-s{seed}.jsonl", "w") as f:
        for step in range(steps):
            rec_update = step < 300 and step % 5 == 0 or step % 50 == 0
            rec = {"step": step, "masked_share": round(masked_share(st, shape, m.eps, m.noise_schedule, m.antithetic), 4)}
            if step % 100 == 0 or step in (10, 25, 50, 75, 150):
                model.eval()
                rec["attn"] = attention_stats(model, vz)
                model.train()
            before = {n: p.detach().float().clone() for n, p in names} if rec_update else None
            loss, gnorm, bad, _, _ = st.run(step, loader.next)
            rec.update(loss=round(loss.item(), 5), grad_norm=round(gnorm.item(), 5), lr=st.optimizer.param_groups[0]["lr"])
            losses.append(rec["loss"])
            if before is not None:
                num, den = {}, {}
                for n, p in names:
                    k = group_of(n)
                    num[k] = num.get(k, 0.0) + (p.detach().float() - before[n]).pow(2).sum().item()
                    den[k] = den.get(k, 0.0) + before[n].pow(2).sum().item()
                rec["update"] = {k: round(math.sqrt(num[k] / max(den[k], 1e-30)), 7) for k in num}
            f.write(json.dumps(rec) + "\n")
    tail = sum(losses[-100:]) / len(losses[-100:])
    first = next((i for i, v in enumerate(losses) if v < 3.0), None)
    return {"label": label, "seed": seed, "final_loss_last100": round(tail, 4), "first_step_below_3": first,
            "seconds": round(time.time() - t0, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shakespeare_char_mdlm")
    ap.add_argument("--seeds", default="0,1,2,3,4,5")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--label", default="recipe")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [probe(a.preset, int(s), a.steps, a.overrides, a.out, a.label) for s in a.seeds.split(",")]
    print(markdown_table(["label", "seed", "loss (last 100 steps)", "first step < 3.0", "s"], [[r["label"], r["seed"],
          r["final_loss_last100"], r["first_step_below_3"], r["seconds"]] for r in rows], "lrrrr"))


if __name__ == "__main__":
    main()

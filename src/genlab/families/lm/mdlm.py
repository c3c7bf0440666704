"""Masked diffusion language model (MDLM; Sahoo et al. 2024, arXiv:2406.07524), absorbing state with SUBS; the
continuous and T-step NELBOs (MDLM eqs. 10 and 8) and the sampler: docs/lm.md. The backbone ignores t.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core import progress
from genlab.core.errors import GenlabError
from genlab.eval.nfe import parse_int_list
from genlab.families.base import method_registry
from genlab.families.build import load_run
from genlab.families.lm import common as lm
from genlab.families.lm.autoregressive import score_nats


def alpha(t: torch.Tensor, schedule: str, eps: float = 0.0) -> torch.Tensor:
    """P(token still clean at time t). loglinear: 1 - (1-eps) t; cosine: 1 - (1-eps)(1 - cos(pi t / 2))."""
    # 1 - cos(h) written as 2 sin^2(h/2): no cancellation to 0 in float32 at small t
    m = t if schedule == "loglinear" else 2 * torch.sin(0.25 * math.pi * t) ** 2
    return 1 - (1 - eps) * m


def weight(t: torch.Tensor, schedule: str) -> torch.Tensor:
    """-alpha'_t / (1 - alpha_t): the continuous-time NELBO weight (independent of eps)."""
    if schedule == "loglinear":
        return 1 / t
    h = 0.25 * math.pi * t
    return 0.5 * math.pi * torch.cos(h) / torch.sin(h)  # (pi/2) sin(2h) / (2 sin^2 h)


def antithetic_uniform(n: int, generator, device, antithetic: bool = True) -> torch.Tensor:
    """n draws in [0, 1): one shared offset plus a stratified grid (low-variance), or iid."""
    if not antithetic:
        return torch.rand(n, generator=generator, device=device)
    return (torch.rand(1, generator=generator, device=device) + torch.arange(n, device=device) / n) % 1


def masked_nll(model, x: torch.Tensor, mask_prob: torch.Tensor, u_tok: torch.Tensor, vocab: int, mask_id: int):
    """Per-sequence sum of -log p(x_l | z) over masked positions; z masks x where u_tok < mask_prob [B]."""
    masked = u_tok < mask_prob[:, None]
    z = torch.where(masked, torch.full_like(x, mask_id), x)
    logits = model(z)[..., :vocab]  # SUBS: no mass on [MASK] or padding ids
    nll = F.cross_entropy(logits.reshape(-1, vocab).float(), x.reshape(-1), reduction="none").view_as(x)
    return (nll * masked).sum(1)


def nelbo_estimates(model, x, T_list, schedule, vocab, mask_id, generator, antithetic=True) -> dict:
    """One coupled Monte Carlo draw per sequence of the continuous (key inf) and each T-step NELBO,
    in nats per sequence [B]. The same time and token uniforms serve every T."""
    B = x.shape[0]
    t = 1 - antithetic_uniform(B, generator, x.device, antithetic)           # (0, 1]
    u_tok = torch.rand(x.shape, generator=generator, device=x.device)
    out = {math.inf: weight(t, schedule) * masked_nll(model, x, 1 - alpha(t, schedule), u_tok, vocab, mask_id)}
    for T in T_list:
        i = torch.ceil(t * T).clamp(1, T)
        ti, si = i / T, (i - 1) / T
        at, as_ = alpha(ti, schedule), alpha(si, schedule)
        w = T * (as_ - at) / (1 - at)   # i is uniform on 1..T: T * the term of step i
        out[T] = w * masked_nll(model, x, 1 - at, u_tok, vocab, mask_id)
    return out


def bound_stats(draws: torch.Tensor, reps: int) -> tuple[float, float]:
    """Mean and standard error of a bound from draws [reps * n] (pass-major): each sequence's draws are averaged
    first, so the standard error is over the n independent sequences (NaN for one)."""
    v = draws.view(reps, -1).mean(0)
    return v.mean().item(), (v.std() / math.sqrt(len(v))).item() if len(v) > 1 else float("nan")


def parse_template(spec: dict, prompt: str, length: int, mask_id: int) -> list[int]:
    """Prompt text with "[[N]]" holes -> ids of `length`, mask_id where the model generates."""
    ids, pos = [], 0
    for m in lm.INFILL.finditer(prompt):
        ids += lm.encode_prompt(spec, prompt[pos:m.start()]) + [mask_id] * int(m.group(1))
        pos = m.end()
    ids += lm.encode_prompt(spec, prompt[pos:]) if prompt[pos:] else []
    if len(ids) > length:
        raise GenlabError(f"the prompt template takes {len(ids)} tokens, more than the sample length {length}")
    return ids + [mask_id] * (length - len(ids))


@torch.no_grad()
def ancestral_sample(model, z: torch.Tensor, steps: int, schedule: str, vocab: int, mask_id: int, generator=None,
                     temperature: float = 1.0, block_len: int = 0, stats: dict | None = None) -> torch.Tensor:
    """MDLM's ancestral sampler (SUBS, docs/lm.md): t from 1 to 0 in `steps` steps, logits reused while nothing is
    revealed; block_len > 0: semi-autoregressive blocks, left to right, `steps` steps each."""
    L = z.shape[1]
    todo = z == mask_id
    blocks = [(0, L)] if block_len <= 0 else [(a, min(a + block_len, L)) for a in range(0, L, block_len)]
    calls = 0
    pos = torch.arange(L, device=z.device)
    task = progress.Task(f"sampling {z.shape[0]} x {L} tokens", total=len(blocks) * steps, unit="step")
    for a, b in blocks:
        free = todo & (pos >= a) & (pos < b)
        cached = None
        for i in range(steps, 0, -1):
            task.update()
            t, s = torch.tensor(i / steps), torch.tensor((i - 1) / steps)
            p = float((alpha(s, schedule) - alpha(t, schedule)) / (1 - alpha(t, schedule)))
            masked = (z == mask_id) & free
            if not masked.any():
                break
            if cached is None:
                cached = model(z)[..., :vocab].float()
                calls += 1
            g = -torch.log(-torch.log(torch.rand(cached.shape, generator=generator, device=z.device).clamp_min(1e-20)))
            draw = (cached / max(temperature, 1e-6) + g).argmax(-1) if temperature > 0 else cached.argmax(-1)
            reveal = masked & (torch.rand(z.shape, generator=generator, device=z.device) < p)
            if reveal.any():
                z = torch.where(reveal, draw, z)
                cached = None  # the input changed: the next step needs a fresh forward pass
    task.close()
    if stats is not None:
        stats["model_calls"] = calls
    return z


class MaskedDiffusion(lm.TokenMethod):
    sample_options = ("prompt", "temperature", "length", "block_len")
    model_families, causal = ("gpt",), False
    sampling_keys = ("method.temperature", "method.sample_len", "method.prompt", "method.block_len", "method.sample_steps")

    @staticmethod
    def check_config(cfg):
        parse_int_list(cfg.eval.T_list, "eval.T_list")
    sample_header = ("mdlm samples: {steps} steps, {model_calls} model calls per batch, block_len {block_len}, "
                     "schedule {schedule}, prompt {prompt!r}")
    batch_keys = ("x",)
    best_metric = "nelbo_loss"  # log.keep_best keeps the checkpoint with the lowest value

    name = "mdlm"

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.schedule = self.mcfg.noise_schedule  # noise_schedule and eps: checked by their fields

    def backbone(self, model):
        base = super().backbone(model)
        if base.n_vocab <= base.mask_id or base.mask_id < self.V:
            raise GenlabError("mdlm needs a spare embedding row for [MASK] (model vocab > data vocab)")
        return base

    def loss(self, model, batch, ctx):
        keys, generator = MdlmKeys.of(self.mcfg), ctx.generator
        if not self._checked:
            self.mask_id = self.backbone(model).mask_id
            self._checked = True
        x = batch["x"]
        B, L = x.shape
        eps = keys.eps
        t = (eps + (1 - eps) * antithetic_uniform(B, generator, x.device, keys.antithetic)).clamp_min(1e-6)
        u_tok = torch.rand(x.shape, generator=generator, device=x.device)
        masked = u_tok < (1 - alpha(t, self.schedule, eps))[:, None]
        z = torch.where(masked, torch.full_like(x, self.mask_id), x)
        # per-token weights of the NELBO: w(t) on masked positions, 0 elsewhere (SUBS), / (B * L) tokens;
        # the model computes sum(weights * CE) over the real vocabulary (no mass on [MASK] or padding)
        w = masked * (weight(t, self.schedule) / (B * L))[:, None]
        return model(z, targets=x, weights=w, vocab=self.V), {}

    @torch.no_grad()
    def bounds(self, model, data, ctx) -> tuple[dict, dict, int]:
        """{T: (mean NELBO in nats/token, its standard error)} for T in eval.T_list and T=inf, {T: the same of the
        T-step bound minus the continuous one} (paired: the draws are common to every T), and the tokens scored."""
        ecfg, device = ctx["eval"], ctx["device"]
        base = self.backbone(model)
        T_list = sorted(set(parse_int_list(ecfg.T_list, "eval.T_list")))
        wins = lm.val_windows(data, self.T, ecfg.num_samples)[:, :-1].to(device)
        bs = lm.eval_batch_size(ecfg, self.T, base.n_vocab)
        per_seq = {T: [] for T in [math.inf, *T_list]}
        reps = max(1, ecfg.nelbo_reps)
        batches = [i for _ in range(reps) for i in range(0, len(wins), bs)]
        for i in progress.track(batches, f"eval: NELBO of {len(wins)} sequences x {reps}", unit="batch"):
            est = nelbo_estimates(model, wins[i:i + bs], T_list, self.schedule, self.V, base.mask_id, ctx["generator"])
            for T, v in est.items():
                per_seq[T].append(v.double().cpu() / self.T)
        draws = {T: torch.cat(parts) for T, parts in per_seq.items()}
        res = {T: bound_stats(v, reps) for T, v in draws.items()}
        gaps = {T: bound_stats(v - draws[math.inf], reps) for T, v in draws.items() if T != math.inf}
        return res, gaps, int(wins.numel())

    def evaluate(self, model, data, ctx) -> dict:
        ecfg = ctx["eval"]
        if ecfg.num_samples <= 0:
            return {}
        res, gaps, n_tok = self.bounds(model, data, ctx)
        nats = res[math.inf][0]
        out = lm.per_token_metrics("nelbo", nats, self.spec)
        out["nelbo_stderr_bits"] = res[math.inf][1] / lm.LN2
        for T, (m, _) in res.items():
            if T != math.inf:
                out[f"nelbo_T{T}_bits_per_token"] = m / lm.LN2
        out["val_tokens_scored"] = n_tok
        if ctx.get("run_dir") is not None:
            write_bound_table(Path(ctx["run_dir"]), res, self.spec, self.schedule, gaps)
        if ecfg.gen_ppl_model:
            out.update(self.generative_ppl(model, ctx))
        return out

    def generative_ppl(self, model, ctx) -> dict:
        """Perplexity of this model's samples under an autoregressive run (eval.gen_ppl_model = run dir)."""
        ecfg, device = ctx["eval"], ctx["device"]
        _, ar, ar_method, _, state = load_run(ecfg.gen_ppl_model, device=str(device))
        ar_spec = state["data_spec"]
        if ar_spec.get("vocab_size") != self.V or ar_spec.get("itos") != self.spec.get("itos") or \
                ar_spec.get("tokenizer") != self.spec.get("tokenizer"):
            raise GenlabError(f"eval.gen_ppl_model {ecfg.gen_ppl_model}: its tokenizer/vocabulary differs from this run's")
        lm.check_backbone(ar, causal=True, method="autoregressive (eval.gen_ppl_model)")
        n = max(1, min(ecfg.gen_samples, ecfg.num_samples))
        z = self.draw(model, n, steps=self.mcfg.sample_steps, generator=ctx["generator"], device=device)
        nats = score_nats(ar, z, self.V, batch=lm.eval_batch_size(ecfg, self.T, ar.n_vocab)).mean().item()
        return {"gen_ppl": math.exp(min(nats, 50.0)), "gen_nats_per_token": nats, "gen_unigram_entropy": lm.unigram_entropy(z),
                "gen_samples": n, "gen_steps": self.mcfg.sample_steps}

    def draw(self, model, n, *, steps=None, generator=None, device=None, prompt="", temperature=None, length=None,
             block_len=None, stats=None):
        """Token ids [n, L] from `steps` denoising steps; `stats` (a dict) gets settings and model calls."""
        keys = MdlmKeys.of(self.mcfg)
        base = self.backbone(model)
        if length is not None and not 1 <= length <= self.T:
            raise GenlabError(f"sample length must be 1..{self.T} for mdlm (the model's context, data.seq_len: it "
                              f"generates every position at once), got {length}")
        steps, block_len = steps or self.mcfg.sample_steps, keys.block_len if block_len is None else block_len
        if stats is not None:
            stats.update(steps=steps, block_len=block_len, schedule=self.schedule, prompt=prompt)
        length = min(length or self.mcfg.sample_len or self.T, self.T)
        ids = parse_template(self.spec, prompt, length, base.mask_id) if prompt else [base.mask_id] * length
        z = torch.tensor([ids] * n, dtype=torch.long, device=device)
        return ancestral_sample(model, z, steps, self.schedule, self.V, base.mask_id, generator,
                                self.mcfg.temperature if temperature is None else temperature, block_len, stats)


def write_bound_table(run_dir: Path, res: dict, spec: dict, schedule: str, gaps: dict | None = None):
    """bound_vs_T.md / .csv / .png: the NELBO (bits/token) vs the steps T, ± its standard error; gaps {T: (mean,
    stderr)}: the T-step bound minus the continuous one from the same draws, far more precise than either bound."""
    run_dir.mkdir(parents=True, exist_ok=True)
    unit = "bits/char" if spec.get("tokenizer") == "char" else "bits/token"
    gaps = gaps or {}
    rows = [(("inf" if T == math.inf else str(T)), m / lm.LN2, s / lm.LN2, math.exp(m),
             *(x / lm.LN2 for x in gaps.get(T, (math.nan, math.nan)))) for T, (m, s) in sorted(res.items())]
    (run_dir / "bound_vs_T.csv").write_text("T,nelbo_bits,stderr_bits,ppl_bound,gap_bits,gap_stderr_bits\n" +
                                            "".join(f"{T},{m:.5f},{s:.5f},{p:.4f},{g:.5f},{gs:.5f}\n"
                                                    for T, m, s, p, g, gs in rows))
    md = [f"NELBO upper bound on -log p(x) vs number of steps T (schedule {schedule}; T=inf: continuous time); "
          "± one standard error over the validation sequences. Every T uses the same random draws, so the gap to "
          "T=inf has its own, much smaller, standard error.", "",
          f"| T | NELBO ({unit}) | ± stderr | gap to T=inf | ± stderr | perplexity bound |",
          "| --- | --- | --- | --- | --- | --- |"]
    md += [f"| {T} | {m:.4f} | {s:.4f} | " + ("| " if T == "inf" or math.isnan(g) else f"{g:.4f} | {gs:.4f} ")
           + f"| {p:.3f} |" for T, m, s, p, g, gs in rows]
    (run_dir / "bound_vs_T.md").write_text("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    finite = [(int(T), m, s) for T, m, s, *_ in rows if T != "inf"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    if finite:
        ax.errorbar([T for T, _, _ in finite], [m for _, m, _ in finite], yerr=[s for *_, s in finite], fmt="o-",
                    capsize=3, label="T-step NELBO ± stderr")
    m_inf, s_inf = rows[-1][1], rows[-1][2]
    ax.axhline(m_inf, color="k", ls="--", label="continuous (T=inf) ± stderr")
    if math.isfinite(s_inf):
        ax.axhspan(m_inf - s_inf, m_inf + s_inf, color="k", alpha=0.12, lw=0)
    ax.set_xscale("log")
    ax.set_xlabel("diffusion steps T")
    ax.set_ylabel(f"NELBO ({unit})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "bound_vs_T.png", dpi=120)
    plt.close(fig)


class MdlmKeys(cf.Keys, section="method"):
    noise_schedule: str = cf.F("loglinear", "mdlm: masking schedule", choices=("loglinear", "cosine"))
    antithetic: bool = cf.F(True, "mdlm: stratified (antithetic) training times")
    eps: float = cf.F(1e-3, "mdlm: smallest masking time", ge=0, lt=1)
    block_len: int = cf.F(0, "mdlm sampling: semi-autoregressive blocks of this many tokens (0 = one block)", ge=0)


class MdlmEvalKeys(cf.Keys, section="eval"):
    T_list: str = cf.F("8,32,128,512,1000", "mdlm: step counts T of the bound-vs-T table (plus T=inf)", free="comma-separated integers >= 1")
    nelbo_reps: int = cf.F(2, "mdlm: Monte Carlo draws per validation sequence for the NELBO", ge=1)
    gen_ppl_model: str = cf.F("", "mdlm: autoregressive run that scores samples (generative perplexity)", free="a run folder")
    gen_samples: int = cf.F(16, "mdlm: samples scored for the generative perplexity", ge=1)


method_registry.register("mdlm", "masked diffusion LM (MDLM, absorbing state, SUBS): NELBO, bound vs T, ancestral sampler",
                         keys=(MdlmKeys, MdlmEvalKeys, lm.TextSamplingKeys), reads=("method.sample_steps",))(MaskedDiffusion)

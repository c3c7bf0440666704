"""Text samples of the language family: a .txt file, the settings in its header, each sample under a
`===== sample i =====` line (common.read_samples splits on it)."""
from __future__ import annotations

from pathlib import Path

from genlab.runtime.parallel import unwrap


def write_samples(path, texts: list[str], header: str) -> Path:
    path = Path(path)
    path = path.with_suffix(".txt") if path.suffix.lower() in (".png", ".jpg", "") else path  # the default sample_grid.png
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"===== sample {i} =====\n{t}\n" for i, t in enumerate(texts))
    path.write_text(f"# {header}\n{body}", encoding="utf-8")
    return path


def sample_to_file(method, model, out, *, n=4, steps=None, generator=None, device=None, **options):
    """n samples in a .txt file, headed by method.sample_header filled with the settings draw() reports."""
    stats = {}
    ids = method.draw(model, n, steps=steps, generator=generator, device=device or next(unwrap(model).parameters()).device,
                      stats=stats, **options)
    return write_samples(out, method.decode(ids), method.sample_header.format(**stats))


def preview(method, model, path, ctx):
    return sample_to_file(method, model, path, n=max(1, min(4, ctx["eval"].num_samples)), generator=ctx["generator"],
                          device=ctx["device"], prompt=method.mcfg.prompt)

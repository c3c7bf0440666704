"""World-model rollouts under sampling settings: the same trained run and held-out windows, evaluated with each
(method.sample_temperature, method.quantize_frames) pair. Prints one markdown table: rollout PSNR at the longest
horizon against copy-last, the per-step margin range, whether the model wins at every step, the in-domain Fréchet
distance and the action-sensitivity margin.

    python benchmarks/world_sampling.py runs/pong-world                       # temperatures 1 and 0, quantised or not
    python benchmarks/world_sampling.py runs/pong-world --rollouts 64 --variants 0:q,1:n,0.5:q --device cuda
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genlab.core.tables import markdown_row, markdown_table  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--rollouts", type=int, default=64, help="held-out windows per horizon (eval.world_rollouts)")
    p.add_argument("--variants", default="1:n,1:q,0:n,0:q",
                   help="comma-separated TEMPERATURE:q|n (q = generated frames quantised to uint8 levels)")
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    from genlab.data import build_dataset

    from genlab.runs.load import load_run
    cfg, model, method, dev, _ = load_run(args.run, args.device)
    cfg.eval.world_rollouts = args.rollouts
    data = build_dataset(cfg.data)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in args.variants.split(","):
            temp, q = v.split(":")
            method.mcfg.sample_temperature, method.mcfg.quantize_frames = float(temp), q == "q"
            res = method.evaluate(model, data, {"eval": cfg.eval, "device": dev, "run_dir": tmp})
            curves = json.loads((Path(tmp) / "world_eval.json").read_text())["curves"]
            H = max(curves, key=int)
            margin = [m - c for m, c in zip(curves[H]["model"], curves[H]["copy_last"])]
            rows.append([f"{float(temp):g}", "yes" if q == "q" else "no", f"{res[f'rollout_psnr_h{H}']:.2f} dB",
                         f"{res[f'copy_last_psnr_h{H}']:.2f} dB", f"{min(margin):+.2f} … {max(margin):+.2f} dB",
                         "yes" if min(margin) > 0 else "no", f"{res[f'frechet_h{H}']:.3f}", f"{res['action_margin_db']:+.2f} dB"])
            print(markdown_row(rows[-1]), file=sys.stderr, flush=True)
    print(f"rollouts: {args.rollouts} held-out windows, horizon {H}, {method.mcfg.sample_steps} sampling steps\n")
    print(markdown_table(["temperature", "quantised", "rollout PSNR (mean)", "copy-last", "margin per step",
                          "beats copy-last at every step", "FD", "action margin"], rows, "rlrrllrr"))


if __name__ == "__main__":
    main()

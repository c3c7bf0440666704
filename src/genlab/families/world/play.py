"""`genlab play RUN`: play the learned game in a local web page (stdlib http.server); each /step?a=ACTION request
generates one frame, so the frame rate is the model's.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch

from genlab.core.errors import GenlabError
from genlab.data import build_dataset
from genlab.data.windows import spaced_windows
from genlab.families.build import load_run
from genlab.families.world.render import to_u8, write_video
from genlab.runtime.switches import build_precision

# arrow keys / WASD / space -> the ALE action-name parts they press
KEY_PARTS = {"ArrowUp": "UP", "w": "UP", "ArrowDown": "DOWN", "s": "DOWN", "ArrowLeft": "LEFT", "a": "LEFT",
             "ArrowRight": "RIGHT", "d": "RIGHT", " ": "FIRE"}
# a first-person game (genlab data collect vizdoom): W/S or up/down walk, A/D strafe, left/right turn, space attacks,
# E uses; continuous runs get [move, strafe, turn degrees, attack, use] with the collection's default turn
FPS_KEYS = {"w": "forward", "ArrowUp": "forward", "s": "back", "ArrowDown": "back", "a": "strafe_left",
            "d": "strafe_right", "ArrowLeft": "turn_left", "ArrowRight": "turn_right", " ": "attack", "e": "use"}
FPS_PRIORITY = ("attack", "use", "forward", "back", "strafe_left", "strafe_right", "turn_left", "turn_right")
FPS_TURN = 12.0
# the mouse turns too (the page sends the horizontal pixels moved since the last frame, `dx`): a continuous run turns
# MOUSE_DEGREES_PER_PX per pixel (60 px = one key turn), at most 3 key turns a frame; a discrete run turns once
# MOUSE_DEADZONE_PX or more have moved
MOUSE_DEGREES_PER_PX = FPS_TURN / 60
MOUSE_DEADZONE_PX = 4


class PlaySession:
    """The model, the rolling context of L frames and L actions, and the frames generated so far."""

    def __init__(self, model, method, context: torch.Tensor, actions: torch.Tensor, steps=None, seed=0, record=None,
                 precision=None):
        self.model, self.method, self.steps = model, method, steps
        self.precision = precision  # the run's train.precision: a bf16 run generates under bf16 autocast, as it evaluated
        self.context0, self.actions0 = context.clone(), actions.clone()  # [1, L, C, H, W], [1, L(, D)]
        self.gen = torch.Generator(device=context.device).manual_seed(seed)
        self.lock = threading.Lock()
        self.meanings = method.spec.get("action_meanings") or [str(i) for i in range(method.spec["num_actions"])]
        self.discrete = method.spec["num_actions"] > 0
        self.first_person = "strafe_left" in self.meanings or self.meanings[:2] == ["move", "strafe"]
        self.record, self.recorded = record, []
        self.gen_ms = 0.0
        self.reset()

    @classmethod
    def from_run(cls, run, device="auto", steps=None, record=None, seed=0, temperature=None):
        overrides = [] if temperature is None else [f"method.sample_temperature={temperature}"]
        cfg, model, method, dev, state = load_run(run, device, overrides=overrides)
        if not method.interactive:
            raise GenlabError(f"{run} is not a world-model run (method {cfg.method.name} does not generate frames from "
                              f"controls); play needs method.name=world")
        data = build_dataset(cfg.data)
        frames, actions = spaced_windows(data.val, method.L, 1, dev)
        if frames is None:
            raise GenlabError("the held-out episodes are shorter than the context; nothing to start from")
        return cls(model, method, frames, actions, steps=steps, seed=seed, record=record,
                   precision=build_precision(cfg.train.precision, torch.device(dev)))

    def reset(self):
        with self.lock:
            self.context, self.actions, self.frame_no = self.context0.clone(), self.actions0.clone(), 0
            self.recorded, self.taken = [], collections.deque(maxlen=1000)  # taken: the last actions' names

    def fps_action(self, keys: list[str], dx: float = 0.0):
        held = {FPS_KEYS[k] for k in keys if k in FPS_KEYS}
        if not self.discrete:
            turn = FPS_TURN * (("turn_right" in held) - ("turn_left" in held)) + MOUSE_DEGREES_PER_PX * dx
            return np.array([("forward" in held) - ("back" in held), ("strafe_right" in held) - ("strafe_left" in held),
                             float(np.clip(turn, -3 * FPS_TURN, 3 * FPS_TURN)), "attack" in held, "use" in held],
                            np.float32)
        if abs(dx) >= MOUSE_DEADZONE_PX and not held & {"turn_left", "turn_right"}:
            held.add("turn_right" if dx > 0 else "turn_left")
        for turn in ("turn_left", "turn_right"):  # walking while turning is one action
            if {"forward", turn} <= held and "forward_" + turn[5:] in self.meanings:
                return self.meanings.index("forward_" + turn[5:])
        name = next((a for a in FPS_PRIORITY if a in held), "noop")
        return self.meanings.index(name) if name in self.meanings else 0

    def action_for(self, keys: list[str], dx: float = 0.0):
        """Held keys (first person: and the mouse's move dx) -> an action index (the ALE meaning of the parts) or vector."""
        if self.first_person:
            return self.fps_action(keys, dx)
        parts = {KEY_PARTS[k] for k in keys if k in KEY_PARTS}
        if not self.discrete:
            D = self.actions.shape[-1]
            v = np.zeros(D, np.float32)
            v[0] = ("RIGHT" in parts) - ("LEFT" in parts)
            if D > 1:
                v[1] = ("UP" in parts) - ("DOWN" in parts)
            return v
        digits = [int(k) for k in keys if k.isdigit() and int(k) < len(self.meanings)]
        if digits:
            return digits[-1]
        order = [p for p in ("UP", "DOWN", "RIGHT", "LEFT", "FIRE") if p in parts]
        for drop in range(len(order) + 1):  # the fullest combination the game has
            name = "".join(order[:len(order) - drop]) or "NOOP"
            if name in self.meanings:
                return self.meanings.index(name)
        return 0

    def keymap(self) -> dict:
        names = {}
        keys = FPS_KEYS if self.first_person else {k: p for k, p in KEY_PARTS.items() if p in self.meanings or not self.discrete}
        for k, action in keys.items():
            names.setdefault(action, []).append("Space" if k == " " else k)
        return names

    @torch.no_grad()
    def step(self, action) -> np.ndarray:
        """Advance one frame with `action` (taken on the current last frame); returns uint8 [H, W, 3]."""
        with self.lock:
            a = torch.as_tensor(action, device=self.actions.device, dtype=self.actions.dtype).view(1, 1, *self.actions.shape[2:])
            self.actions = torch.cat([self.actions[:, 1:], a], 1)
            t0 = time.perf_counter()
            with self.precision.autocast(self.context.device) if self.precision else contextlib.nullcontext():
                nxt = self.method.generate(self.model, self.context, self.actions, self.steps, self.gen).float()
            img = to_u8(nxt[0])
            self.gen_ms = 1000 * (time.perf_counter() - t0)
            self.context = torch.cat([self.context[:, 1:], nxt[:, None]], 1)
            self.frame_no += 1
            self.taken.append(self.meanings[int(action)] if self.discrete else str(np.round(action, 2).tolist()))
            if self.record:
                self.recorded.append(img)
            return img

    def current(self) -> np.ndarray:
        return to_u8(self.context[0, -1])

    def save_recording(self, log=print):
        if not self.record or not self.recorded:
            return []
        from PIL import Image
        big = [np.asarray(Image.fromarray(f).resize((f.shape[1] * 4, f.shape[0] * 4), Image.NEAREST)) for f in self.recorded]
        paths = write_video(big, self.record, fps=15, log=log)
        log("recorded " + ", ".join(str(p) for p in paths))
        return paths


def png_bytes(img: np.ndarray) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>genlab play</title>
<style>body{background:#111;color:#ddd;font-family:monospace;text-align:center}
#frame{width:384px;height:384px;image-rendering:pixelated;border:1px solid #555}
#hud span{margin:0 12px}</style></head><body>
<h3>genlab play: every frame is generated by the world model</h3>
<img id="frame" alt="frame"><div id="hud"><span>fps: <b id="fps">0.0</b></span><span>frame: <b id="n">0</b></span>
<span>model: <b id="ms">0</b> ms</span><span>action: <b id="act">-</b></span></div>
<p id="keys"></p><p id="help">R: reset &middot; digits pick an action index</p>
<script>
const held = new Set(); let times = []; let dx = 0; let dragging = false;
document.addEventListener('keydown', e => { if (e.key === 'r') { fetch('/reset'); return; } held.add(e.key); e.preventDefault(); });
document.addEventListener('keyup', e => { held.delete(e.key); });
const frame = document.getElementById('frame');
fetch('/info').then(r => r.json()).then(info => {
  document.getElementById('keys').textContent = 'keys: ' + Object.entries(info.keys).map(([a, k]) => k.join('/') + ' = ' + a).join(', ');
  if (info.mouse_turn) {  // first person: click the view to capture the mouse (Esc frees it), or drag across it
    document.getElementById('help').textContent += ' \u00b7 mouse: click the view (or drag across it) to turn';
    frame.addEventListener('click', () => { if (frame.requestPointerLock) frame.requestPointerLock(); });
    frame.addEventListener('mousedown', e => { dragging = true; e.preventDefault(); });
    document.addEventListener('mouseup', () => { dragging = false; });
    document.addEventListener('mousemove', e => { if (dragging || document.pointerLockElement === frame) dx += e.movementX; });
  }
});
async function loop() {
  try {
    const sent = dx; dx = 0;
    const r = await fetch('/step?keys=' + encodeURIComponent(JSON.stringify([...held])) + '&dx=' + sent);
    const blob = await r.blob();
    const img = document.getElementById('frame'); const old = img.src;
    img.src = URL.createObjectURL(blob); if (old) URL.revokeObjectURL(old);
    const now = performance.now(); times.push(now); times = times.filter(t => now - t < 1000);
    document.getElementById('fps').textContent = (times.length / Math.min(1, (now - times[0]) / 1000 || 1)).toFixed(1);
    document.getElementById('n').textContent = r.headers.get('X-Frame');
    document.getElementById('ms').textContent = r.headers.get('X-Gen-Ms');
    document.getElementById('act').textContent = r.headers.get('X-Action');
  } catch (err) { await new Promise(res => setTimeout(res, 200)); }
  requestAnimationFrame(loop);
}
loop();
</script></body></html>"""


def make_server(session: PlaySession, host="127.0.0.1", port=8765) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: one line per frame would flood the console
            pass

        def _send(self, code, body: bytes, ctype, headers=()):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the page was closed mid-frame
                pass

        def do_GET(self):
            url = urlparse(self.path)
            q = parse_qs(url.query)
            if url.path == "/":
                return self._send(200, PAGE.encode(), "text/html; charset=utf-8")
            if url.path == "/info":
                info = {"actions": session.meanings, "keys": session.keymap(), "context": session.method.L,
                        "mouse_turn": session.first_person}
                return self._send(200, json.dumps(info).encode(), "application/json")
            if url.path == "/reset":
                session.reset()
                return self._send(200, b"{}", "application/json")
            if url.path == "/frame":
                return self._send(200, png_bytes(session.current()), "image/png")
            if url.path == "/step":
                try:
                    keys = json.loads(q.get("keys", ["[]"])[0])
                    dx = float(q.get("dx", ["0"])[0])
                    action = int(q["a"][0]) if "a" in q else session.action_for([str(k) for k in keys], dx)
                except (ValueError, TypeError) as e:
                    return self._send(400, f"bad request: {e}".encode(), "text/plain")
                img = session.step(action)
                return self._send(200, png_bytes(img), "image/png",
                                  [("X-Frame", str(session.frame_no)), ("X-Gen-Ms", f"{session.gen_ms:.1f}"),
                                   ("X-Action", session.taken[-1])])
            return self._send(404, b"not found", "text/plain")

    return ThreadingHTTPServer((host, port), Handler)


def run_play(run, host="127.0.0.1", port=8765, device="auto", steps=None, record=None, log=print, temperature=None):
    session = PlaySession.from_run(run, device, steps=steps, record=record, temperature=temperature)
    server = make_server(session, host, port)
    log(f"genlab play: open http://{host}:{server.server_address[1]}/  (arrow keys / WASD / space; Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        session.save_recording(log)
    return 0

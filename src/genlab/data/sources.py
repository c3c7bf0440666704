"""Where images come from: a class folder (one subfolder per class, ImageNet's train layout) or a CSV/JSON file
list with labels. Each lister returns (file, class index) pairs and the class names, after checking that the
source has images and that every listed file exists."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from genlab.core.errors import GenlabError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def list_class_folder(root: Path) -> tuple[list, list]:
    """(file, class index) of every image under root/<class>/ (sorted), and the sorted class names."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files = [(f, ci) for ci, c in enumerate(classes) for f in sorted((root / c).rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise GenlabError(f"no images found under '{root}/<class>/' (suffixes: {', '.join(sorted(IMAGE_SUFFIXES))})")
    return files, classes


def list_file(src: Path) -> tuple[list, list]:
    """(path, label) rows of a .csv (header with `path` and `label` columns) or .json (a list of
    {"path", "label"} objects); relative paths are relative to the list's folder. Labels that are all
    integers are class ids (classes "0".."max"); otherwise class names, numbered in sorted order."""
    try:
        if src.suffix.lower() == ".json":
            rows = json.loads(src.read_text())
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise GenlabError(f"{src}: expected a JSON list of {{\"path\": ..., \"label\": ...}} objects")
        else:
            with open(src, newline="") as f:
                rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise GenlabError(f"cannot read file list {src}: {e}") from None
    if not rows:
        raise GenlabError(f"file list {src} is empty")
    for i, r in enumerate(rows):
        if r.get("path") in (None, "") or r.get("label") in (None, ""):
            raise GenlabError(f"{src}: row {i + 1} needs both 'path' and 'label' (got {sorted(k for k in r if k)})")
    raw = [str(r["label"]).strip() for r in rows]
    if all(x.lstrip("-").isdigit() for x in raw):
        ids = [int(x) for x in raw]
        if min(ids) < 0:
            raise GenlabError(f"{src}: integer labels must be >= 0, got {min(ids)}")
        classes = [str(i) for i in range(max(ids) + 1)]
    else:
        classes = sorted(set(raw))
        number = {c: i for i, c in enumerate(classes)}
        ids = [number[x] for x in raw]
    files = [(Path(r["path"]) if Path(r["path"]).is_absolute() else src.parent / r["path"], c) for r, c in zip(rows, ids)]
    return files, classes


def list_source(src) -> tuple[list, list]:
    if not src:
        raise GenlabError("`data prepare shards` needs --src: a folder with one subfolder per class, or a .csv/.json file list")
    p = Path(src)
    if not p.exists():
        raise GenlabError(f"--src '{p}' does not exist")
    files, classes = list_class_folder(p) if p.is_dir() else list_file(p)
    missing = [str(f) for f, _ in files if not f.is_file()]
    if missing:
        raise GenlabError(f"{len(missing)} listed image(s) missing, first: {missing[0]}")
    return files, classes

"""The embedded default corpus: the opening ~40 KB of Tiny Shakespeare (Karpathy's char-rnn
compilation of Shakespeare's plays, public domain), so a text run needs no files. The text ships
as package data (shakespeare_excerpt.txt), read as UTF-8 bytes so no newline translation applies."""
from importlib.resources import files


def read_corpus() -> str:
    return files("genlab.data").joinpath("shakespeare_excerpt.txt").read_bytes().decode("utf-8")

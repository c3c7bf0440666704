import difflib


def did_you_mean(word: str, options) -> str:
    """' (did you mean X?)' for a close match among options, else ''."""
    close = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class GenlabError(Exception):
    """A user-facing error: the CLI prints it on one line and exits with code 2."""


class RunFailed(GenlabError):
    """A run that had started failed (an exception in a method, CUDA out of memory): its summary.json
    says status "failed" with the reason; the CLI prints one line and exits 1."""


def machine_failure(e: BaseException) -> bool:
    """An error of the machine, not of the input (disk full, quota, I/O error, read-only disk, out of memory): such
    failures exit 1 like a failed run, so a scheduler does not read them as a bad command line (exit 2)."""
    import errno
    if isinstance(e, MemoryError):
        return True
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM)


def debug() -> bool:
    """GENLAB_DEBUG=1: let unexpected exceptions show their traceback instead of one line."""
    import os
    return os.environ.get("GENLAB_DEBUG", "") not in ("", "0")


def one_line(e: BaseException) -> str:
    """`Type: first line of the message`, for summaries and the console."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")

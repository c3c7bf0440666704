class GenlabError(Exception):
    """A user-facing error: the CLI prints it on one line and exits with code 2."""

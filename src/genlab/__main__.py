import os

from genlab.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    from genlab.runtime.parallel import exit_rank
    exit_rank(0 if code is None else code if isinstance(code, int) else 1)
raise SystemExit(code)

import os
import sys

from genlab.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # under torchrun, a finished rank skips interpreter teardown: there gloo's and the rendezvous store's C++ threads
    # intermittently abort it ("terminate called without an active exception", SIGABRT) after its work is done and
    # saved (CI, test_sparse_transformer_two_ranks_follow_the_one_process_run); files are closed by then
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
raise SystemExit(code)

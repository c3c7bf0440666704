"""The pytest plugin of benchmarks/gpu_tests.py's streams (`-p gpu_tests_plugin`): which items a stream runs, and each
failure printed when it happens. Kept apart from gpu_tests.py so that a stream's startup imports neither torch nor
genlab (the selected tests import what they need)."""
import os


def pytest_collection_modifyitems(config, items):
    """Stream k of n (GENLAB_TEST_STREAM=k/n) keeps items k, k + n, ... of the selection, after
    the -m/-k deselection (trylast), so that it runs exactly ids[k::n] of the collection; GENLAB_TEST_ONLY: that one id."""
    k, _, n = os.environ.get("GENLAB_TEST_STREAM", "0/1").partition("/")
    only = os.environ.get("GENLAB_TEST_ONLY")
    items[:] = [it for it in items if it.nodeid == only] if only else items[int(k)::int(n)]


pytest_collection_modifyitems.trylast = True  # pluggy reads the attribute set by @pytest.hookimpl(trylast=True)


def pytest_runtest_logreport(report):
    """A failure's traceback printed when it happens, so a stream stopped by its limit keeps it (pytest
    prints them only in the final summary)."""
    if report.failed:
        print(f"\n--- {report.nodeid} ({report.when}) failed:\n{report.longreprtext}\n---", flush=True)

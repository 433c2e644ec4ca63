"""Run one multi-rank test body of ``tests/`` under ``iris.run``, its output in the terminal.

The test harness runs bodies in a pool of rank processes whose output pytest does not
show when a rank dies (a crash, a device trap). This runs the same body once per rank
as a plain launch, so every rank's stderr (tracebacks, hang reports, faulthandler)
reaches the terminal. Arguments after the body are passed as strings.

    python -m iris.run -n 4 scripts/run_test_body.py test_ccl:_all_reduce_body ring sum
"""

import importlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> None:
    if len(sys.argv) < 2 or ":" not in sys.argv[1]:
        raise SystemExit("usage: run_test_body.py MODULE:FUNCTION [ARG ...]  (a module of tests/)")
    from iris import config
    from iris.backends import make_backend
    from iris.host.distributed.helpers import init_distributed

    communicator = init_distributed(make_backend(config.BACKEND).dist_backend)
    module_name, function_name = sys.argv[1].split(":")
    body = getattr(importlib.import_module(module_name), function_name)
    result = body(communicator.rank, communicator.world_size, *sys.argv[2:])
    print(f"[rank {communicator.rank}] {function_name}{tuple(sys.argv[2:])}: {result}", flush=True)


if __name__ == "__main__":
    main()

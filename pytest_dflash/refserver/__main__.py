"""``python -m pytest_dflash.refserver [flags]``: start the reference host, as ``python -m sglang.launch_server``.

The import order is SGLang's, so faults that break an import break it at the same point: the
server-args module (xgrammar) before flags are parsed, the HTTP server module (soundfile) after.
"""

from __future__ import annotations

import sys

from pytest_dflash.refserver import faults

faults.activate_from_argv(sys.argv[1:])  # before the imports below: some faults break them

from pytest_dflash.refserver.logs import setup_logging  # noqa: E402
from pytest_dflash.refserver.server_args import ServerArgs, prepare_server_args  # noqa: E402


def run_server(server_args: ServerArgs) -> None:
    from pytest_dflash.refserver.server import launch_server

    launch_server(server_args)


if __name__ == "__main__":
    server_args = prepare_server_args(sys.argv[1:])
    setup_logging(server_args.log_level)
    try:
        run_server(server_args)
    except BaseException:
        faults.kill_process_tree(include_parent=False)  # SGLang logs this before the traceback
        raise

"""``python -m pytest_dflash.refserver [flags]``: start the reference host, as
``python -m sglang.launch_server``.

The import order is SGLang's, so faults that break an import break it at the same point: the
server-args module (xgrammar) before flags are parsed, the HTTP server module (soundfile) after.
"""

from __future__ import annotations

import sys

from pytest_dflash.refserver import faults, mimic

faults.activate_from_argv(sys.argv[1:])  # before the imports below: some faults break them

import logging  # noqa: E402

from pytest_dflash.refserver.logs import setup_logging  # noqa: E402
from pytest_dflash.refserver.server_args import ServerArgs, prepare_server_args  # noqa: E402


def run_server(server_args: ServerArgs) -> None:
    from pytest_dflash.refserver.server import launch_server

    launch_server(server_args)


if __name__ == "__main__":
    mimicked, argv = mimic.split_argv(sys.argv[1:])  # a flag the mimicked release removed: exit 2
    server_args = prepare_server_args(argv)
    setup_logging(server_args.log_level)
    for line in mimicked.deprecation_lines(argv):  # SGLang's print_deprecated_warning
        logging.getLogger("pytest_dflash.refserver").warning("\033[1;33m%s\033[0m", line)
    server_args.mimic = mimicked
    try:
        run_server(server_args)
    except BaseException:
        faults.kill_process_tree(include_parent=False)  # SGLang logs this before the traceback
        raise

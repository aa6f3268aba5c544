"""Device-only diagnostic: where does a server's first request spend minutes?

tools/device/run_real_ddtree.sh copies this file into each staged tree as ``sitecustomize.py`` when
DFLASH_DIAG_STACKS="EVERY:FOR" (seconds) is set. Every Python process started on that tree (the server and
each of its scheduler / tokenizer / detokenizer children) then writes all its threads' stacks to
/tmp/stacks/<pid>.txt every EVERY seconds for its first FOR seconds. faulthandler dumps from its own C thread,
so a process stuck in a compiler call or a lock still shows where. Nothing happens when the variable is unset.

UNSAFE for a recorded run: on the H200 (run 4) three SGLang processes died of SIGSEGV in the middle of a dump
(Python 3.12's faulthandler walks frames that another thread is changing). For diagnosis only.
"""

import os

_SPEC = os.environ.get("DFLASH_DIAG_STACKS", "")
if _SPEC:
    try:
        import faulthandler
        import threading
        import time

        _every, _for = (float(part) for part in _SPEC.split(":"))
        os.makedirs("/tmp/stacks", exist_ok=True)
        _out = open(f"/tmp/stacks/{os.getpid()}.txt", "w", buffering=1)  # noqa: SIM115 (faulthandler keeps its fd)
        with open("/proc/self/cmdline", "rb") as _cmd:
            _argv = _cmd.read().replace(b"\0", b" ").decode(errors="replace")
        _out.write(f"pid {os.getpid()} ppid {os.getppid()} started {time.time():.3f} every {_every}s: "
                   f"{_argv}\n")
        faulthandler.dump_traceback_later(_every, repeat=True, file=_out)
        _stop = threading.Timer(_for, faulthandler.cancel_dump_traceback_later)
        _stop.daemon = True
        _stop.start()
    except Exception as exc:  # a diagnostic must never stop the server it watches
        print(f"stack_sampler: off ({exc})")

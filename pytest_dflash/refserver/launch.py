"""Start a refserver subprocess for tests, find its port, and always kill it.

>>> with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
...     httpx.post(f"{server.url}/generate", json={"text": "Hi"}, timeout=10)

The child runs ``python -m pytest_dflash.refserver --host 127.0.0.1 --port 0 ARGS`` in its own
process group with stdout+stderr in a temporary file (no pipe to fill up). The port comes from the
"Uvicorn running on http://HOST:PORT" log line. Every wait has one deadline and ends early when the
process dies; the process group is SIGKILLed on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["RefServerError", "RefServerExited", "RefServerProcess", "RefServerTimeout"]

PORT_LINE = re.compile(r"Uvicorn running on https?://(\S+):(\d+) \(Press CTRL\+C to quit\)")


class RefServerError(RuntimeError):
    """The refserver did not do what the caller waited for."""


class RefServerExited(RefServerError):
    """The process ended while the caller waited for it; carries its exit status and log."""

    def __init__(self, what: str, returncode: int, log: str) -> None:
        super().__init__(f"refserver exited with status {returncode} while {what}; log tail:\n{log[-3000:]}")
        self.returncode = returncode
        self.log = log


class RefServerTimeout(RefServerError):
    """A deadline passed (the process may still run)."""


class RefServerProcess:
    """A ``python -m pytest_dflash.refserver`` child process; a context manager."""

    def __init__(
        self,
        *args: str,
        wait_ready: bool = True,
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.args = list(args)
        self.wait_ready_on_enter = wait_ready
        self.timeout_s = timeout_s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.python = python
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file = tempfile.NamedTemporaryFile(prefix="refserver-", suffix=".log", delete=False)  # noqa: SIM115
        self.log_path = Path(self._log_file.name)
        self._final_log: str | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        cmd = [self.python, "-m", "pytest_dflash.refserver"]
        if "--host" not in self.args:
            cmd += ["--host", "127.0.0.1"]
        if "--port" not in self.args:
            cmd += ["--port", "0"]
        self.proc = subprocess.Popen(
            [*cmd, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # its own process group: one killpg ends it and its children
        )

    def __enter__(self) -> RefServerProcess:
        self.start()
        try:  # cleanup is armed before any wait: a failed start never leaves a process behind
            if self.wait_ready_on_enter:
                self.wait_ready(self.timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGKILL the whole process group and reap the child (idempotent)."""
        if self.proc is None:  # never started: just drop the log file
            if not self._log_file.closed:
                self._log_file.close()
                self._final_log = ""
                self.log_path.unlink(missing_ok=True)
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
        else:  # the leader is gone; stragglers of its group may not be
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if not self._log_file.closed:
            self._log_file.close()
            self._final_log = self.log_text()
            self.log_path.unlink(missing_ok=True)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group (SIGTERM asks for SGLang's graceful drain)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    # --- state ------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """None while running; like a shell: 137 for SIGKILL (Popen's -9), 1 for an exception."""
        assert self.proc is not None, "not started"
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RefServerError("the port is not known yet: call wait_port() first")
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """Everything the server has written so far (stdout and stderr); kept after stop()."""
        if self._final_log is not None:
            return self._final_log
        return self.log_path.read_text(errors="replace")

    # --- waits ------------------------------------------------------------------------------------

    def wait_port(self, timeout_s: float | None = None) -> int:
        """The port from the 'Uvicorn running on' line."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            if (m := PORT_LINE.search(self.log_text())) is not None:
                self.port = int(m.group(2))
                return self.port
            self._check_alive("waiting for the port")
            if time.monotonic() > deadline:
                raise RefServerTimeout(f"no 'Uvicorn running on' line after "
                                       f"{timeout_s or self.timeout_s:g} s")
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until GET /health_generate answers 200 (a real generation); fail fast on death."""
        budget = timeout_s or self.timeout_s
        deadline = time.monotonic() + budget
        self.wait_port(budget)
        while self.get_status("/health_generate", timeout_s=10.0) != 200:
            self._check_alive("waiting for /health_generate")
            if time.monotonic() > deadline:
                raise RefServerTimeout(f"/health_generate not 200 after {budget:g} s")
            time.sleep(0.05)

    def wait_exit(self, timeout_s: float | None = None) -> int:
        """Wait for the process to end; its shell-style exit status."""
        assert self.proc is not None, "not started"
        try:
            self.proc.wait(timeout=timeout_s or self.timeout_s)
        except subprocess.TimeoutExpired:
            raise RefServerTimeout(f"still running after {timeout_s or self.timeout_s:g} s") from None
        code = self.returncode
        assert code is not None
        return code

    def get_status(self, path: str, *, timeout_s: float = 5.0) -> int | None:
        """HTTP status of GET ``path``, or None if nothing answered."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, urllib.error.URLError):
            return None

    def _check_alive(self, what: str) -> None:
        code = self.returncode
        if code is not None:
            raise RefServerExited(what, code, self.log_text())

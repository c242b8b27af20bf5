"""A child process whose output lines are collected by a reader thread: the process helper the
real-peer tests (tests/interop) and the monitoring tests (tests/deploy) share. Standard library
only, so every test venv can import it."""

import re
import subprocess
import threading
import time

STARTUP_TIMEOUT_S = 30


class Proc:
    """A child process whose output lines are collected by a reader thread."""

    def __init__(self, cmd, env=None, cwd=None, preexec_fn=None):
        self.cmd = cmd
        self.lines = []
        self.cond = threading.Condition()
        self.p = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            preexec_fn=preexec_fn,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pattern, timeout=STARTUP_TIMEOUT_S):
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.p.poll() is not None:
                    raise RuntimeError(f"{self.cmd[0]} never printed {pattern!r}; output:\n" + "\n".join(self.lines[-40:]))
                self.cond.wait(left)

    def output(self):
        with self.cond:
            return "\n".join(self.lines)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL if it has not exited within `timeout` (nginx's master stops its
        workers on SIGTERM; a SIGKILL orphans them)."""
        if self.p.poll() is None:
            self.p.terminate()
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

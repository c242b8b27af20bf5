"""The client drivers: one long-lived Python (mcp 1.x) and one Node process per pytest worker, each
running the client scripts of clients/ on request, many at a time (clients/driven.py and
clients/driven.mjs say how). Starting Python and importing the SDK costs ~0.5 s of CPU and Node
~0.3 s, more than most client runs: one process per worker instead of one per client takes about
a third off the interop suite's CPU (issue 36). Every run is still the SDK's own client with its own
connections; a run that is cancelled closes them, as a killed process would.

`start(runtime, script, argv)` returns a `Run`: the lines the run said, `wait_for` one of them,
`resume` its stop, its `result`, `kill` it. A driver that dies ends its runs with what it wrote
on stderr, and the next run starts a new one.
"""

import atexit
import json
import shutil
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLIENTS = HERE / "clients"
PY_LEGACY = HERE / ".venv" / "mcp1" / "bin" / "python"
NODE = shutil.which("node") or "node"
RESULT_TIMEOUT_S = 60
KILL_TIMEOUT_S = 10


class Run:
    """One client run inside a driver."""

    def __init__(self, driver, run_id, label):
        self.driver, self.id, self.label = driver, run_id, label
        self.lines, self.errors = [], []
        self.ended = False
        self.cond = threading.Condition()

    def feed(self, message):
        with self.cond:
            if "line" in message:
                self.lines.append(message["line"])
            if "err" in message:
                self.errors.append(message["err"])
            if message.get("end"):
                self.ended = True
            self.cond.notify_all()

    def wait_for(self, word, n=1, timeout=RESULT_TIMEOUT_S):
        """Waits for the run's n-th `word {json}` line; returns its json."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                seen = [l for l in self.lines if l.startswith(word + " ")]
                if len(seen) >= n:
                    return json.loads(seen[n - 1][len(word) + 1:])
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    raise AssertionError(f"the {self.label} never said {word} #{n}:\n{self.transcript()}")
                self.cond.wait(left)

    def resume(self):
        """Releases the run's current stop (or its next one)."""
        self.driver.send({"id": self.id, "go": True})

    def wait_ended(self, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: self.ended, timeout)

    def result(self, timeout=RESULT_TIMEOUT_S):
        """The run's result: its last line, a JSON object."""
        if not self.wait_ended(timeout):
            self.kill()
            raise AssertionError(f"the {self.label} did not finish:\n{self.transcript()}")
        with self.cond:
            found = [l for l in self.lines if l.startswith("{")]
        if not found:
            raise AssertionError(f"the {self.label} gave no result:\n{self.transcript()}")
        return json.loads(found[-1])

    def kill(self):
        """Cancels the run; returns once it ended (its connections closed)."""
        if not self.ended:
            self.driver.send({"id": self.id, "cancel": True})
            if not self.wait_ended(KILL_TIMEOUT_S):
                self.driver.stop()

    def transcript(self):
        with self.cond:
            return ("said:\n" + "\n".join(self.lines) + "\nraised:\n" + "\n".join(self.errors)
                    + "\ndriver's stderr (last lines):\n" + self.driver.stderr_tail())


class Driver:
    """One driver process and its runs."""

    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd, cwd=str(CLIENTS), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        self.runs = {}
        self.next_id = 0
        self.lock = threading.Lock()
        self.stderr = deque(maxlen=60)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def alive(self):
        return self.p.poll() is None

    def start(self, script, argv, label):
        with self.lock:
            self.next_id += 1
            run = Run(self, self.next_id, label)
            self.runs[run.id] = run
        self.send({"id": run.id, "script": script, "argv": [str(a) for a in argv]})
        return run

    def send(self, command):
        try:
            with self.lock:
                self.p.stdin.write(json.dumps(command) + "\n")
                self.p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the driver is gone: its runs were ended by _read_stdout

    def _read_stdout(self):
        for line in self.p.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                self.stderr.append("(stdout) " + line.rstrip("\n"))
                continue
            run = self.runs.get(message.get("id"))
            if run is not None:
                run.feed(message)
                if message.get("end"):
                    self.runs.pop(run.id, None)
        # The driver exited: whatever still runs in it has ended.
        self.p.wait()
        for run in list(self.runs.values()):
            run.feed({"err": f"the driver exited ({self.p.returncode})", "end": True})
        self.runs.clear()

    def _read_stderr(self):
        for line in self.p.stderr:
            self.stderr.append(line.rstrip("\n"))

    def stderr_tail(self):
        return "\n".join(list(self.stderr)[-40:])

    def stop(self):
        """Ends the driver: stdin closed (its runs are cancelled), then killed if it lingers."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass
        try:
            self.p.wait(timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=KILL_TIMEOUT_S)


_drivers = {}
_drivers_lock = threading.Lock()


def driver(runtime):
    """This worker's driver for `runtime` ("py": mcp 1.x, "node"), started on first use."""
    with _drivers_lock:
        d = _drivers.get(runtime)
        if d is None or not d.alive():
            cmd = [str(PY_LEGACY), "driven.py"] if runtime == "py" else [NODE, "driven.mjs"]
            d = _drivers[runtime] = Driver(cmd)
        return d


def start(runtime, script, argv, label=None):
    """Starts `script` (a module of clients/, without its extension) with `argv` in this worker's
    `runtime` driver."""
    return driver(runtime).start(script, argv, label or f"{runtime} {script}")


@atexit.register
def _stop_all():
    for d in list(_drivers.values()):
        d.stop()

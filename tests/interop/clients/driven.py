"""Many runs of the Python client scripts in one process (issue 36: starting Python and importing
the SDK costs ~0.5 s of CPU, more than most runs; the interop suite made ~170 such clients).

A client script defines `async def run(argv, io)` returning its result (a JSON-able dict) and ends
with `if __name__ == "__main__": driven.by_hand(run)`, so it still runs by hand:
`python py_sse_client.py URL '<ops>'` prints its lines and its result, and a line on stdin
releases each stop. `io` is how a run talks to whoever drives it:
  io.say(line)                 one output line (the script's `HELD {...}`-style lines)
  await io.stop(word, payload) says `word {payload JSON}` and waits to be released

`python driven.py` is the driver that tests/interop/drivers.py starts once per pytest worker.
It reads one JSON command per stdin line and writes one JSON message per stdout line:
  {"id": N, "script": "py_sse_client", "argv": [...]}  start run N (the script is imported once)
  {"id": N, "go": true}                                release run N's current (or next) stop
  {"id": N, "cancel": true}                            cancel run N (its connections close)
  → {"id": N, "line": "..."}  a line the run said; its result is its last line
  → {"id": N, "err": "..."}   what the run raised (a traceback), or "cancelled"
  → {"id": N, "end": true}    the run is over
Runs are asyncio tasks side by side; stdin's end cancels them all and ends the driver.
"""

import asyncio
import importlib
import json
import sys
import traceback


class ByHand:
    """A run by hand: lines on stdout, each stop released by a line on stdin."""

    def say(self, line):
        print(line, flush=True)

    async def stop(self, word, payload):
        self.say(f"{word} {json.dumps(payload)}")
        await asyncio.to_thread(sys.stdin.readline)


def by_hand(run):
    """Runs a client script's `run` on its command line and prints its result."""
    print(json.dumps(asyncio.run(run(sys.argv[1:], ByHand()))), flush=True)


class Driven:
    """A run under the driver: its lines tagged with its id, its stops released by `go`."""

    def __init__(self, run_id):
        self.id = run_id
        self.released = asyncio.Queue()

    def say(self, line):
        send({"id": self.id, "line": line})

    async def stop(self, word, payload):
        self.say(f"{word} {json.dumps(payload)}")
        await self.released.get()


def send(message):
    # ensure_ascii (the default) keeps U+2028 and the like escaped: one message, one line.
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def one_run(io, script, argv):
    try:
        result = await importlib.import_module(script).run(argv, io)
        io.say(json.dumps(result))
    except asyncio.CancelledError:
        send({"id": io.id, "err": "cancelled"})
    except BaseException:  # an ExceptionGroup too: the run's failure is reported, not the driver's
        send({"id": io.id, "err": traceback.format_exc()})
    finally:
        send({"id": io.id, "end": True})


async def drive():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    runs = {}
    while line := await reader.readline():
        command = json.loads(line)
        run_id = command["id"]
        if "script" in command:
            io = Driven(run_id)
            runs[run_id] = (io, asyncio.create_task(one_run(io, command["script"], command["argv"])))
            runs[run_id][1].add_done_callback(lambda _t, i=run_id: runs.pop(i, None))
        elif run_id in runs and command.get("go"):
            runs[run_id][0].released.put_nowait(None)
        elif run_id in runs and command.get("cancel"):
            runs[run_id][1].cancel()
    tasks = [task for _, task in runs.values()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(drive())

"""A soak that mixes every feature with faults (issue 34 item 5).

Two proxy replicas sharing a state key, in front of the official Python SDK's legacy server
(mcp==1.30.0), with OAuth at the edge (JWTs minted here, key set in a file), the approval gate on
`summarize`, tasks and trace export on. Concurrent workers run modern calls through their MRTR
rounds (legs alternating replicas, each with a refreshed token), abandoned parked calls, gated
calls approved and declined, tasks answered, cancelled and left to expire, and legacy Streamable
HTTP and 2024-11-05 HTTP+SSE clients. Meanwhile the collector goes up, down, hung and up again,
the upstream is killed and restarted, and one replica is restarted.

It fails (exit 1) on any hung operation (past its deadline), any crossed answer (a result
without its operation's nonce), a replica that crashed or panicked, gauges not back to 0 after
their TTLs, or descriptors / RSS not back near the baseline after a quiet period.

    tests/interop/.venv/mcp2/bin/python benches/soak/soak.py --minutes 5
    tests/interop/.venv/mcp2/bin/python benches/soak/soak.py --smoke      # ~40 s, as CI runs it

The proxy binary is `MRTR_PROXY_BIN` (default target/debug/mrtr-proxy).
"""

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "tests" / "interop"), str(ROOT / "tests")]

import httpx2  # noqa: E402

from conftest import free_port  # noqa: E402
from ops import KINDS  # noqa: E402
from stack import Collector, Replica, Upstream, replica_toml  # noqa: E402
from wire import Crossed, Issuer, Refused  # noqa: E402

SUBJECTS = 8
SUCCESS = ("ok", "ok_approval_asked_again", "declined", "cancelled", "expired", "abandoned")
BACKOFF_S = 0.25
FD_SLACK = 16  # descriptors above the baseline still "back"
RSS_SLACK_KIB = 64 * 1024  # RSS above the baseline still "back"
GAUGES = ["mrtr_parked_calls", "mrtr_parked_memory_bytes", "mrtr_tasks", "mrtr_task_memory_bytes",
          "mrtr_legacy_sessions", "mrtr_upstream_sessions"]


class Run:
    """What the operations share: the replicas' URLs, the HTTP client, the issuer, counters."""

    def __init__(self, args, replicas, issuer, http):
        self.urls = [r.proxy.url for r in replicas]
        self.bases = [r.proxy.base for r in replicas]
        self.http, self.issuer = http, issuer
        self.poll_s, self.task_ttl_s = 0.2, args.task_ttl
        self._nonces, self._starts, self._subjects = itertools.count(), itertools.count(), itertools.count()
        self.outcomes = Counter()
        self.faults = []  # [start, end, name] of each fault window, monotonic
        self.calm_failures = Counter()
        self.details = {}  # outcome → the error message it first came with
        self.peaks = {}  # (replica, gauge or "fds" / "rss_mib") → highest seen under load

    def nonce(self):
        return f"n{next(self._nonces):07d}"

    def subject(self):
        return f"soak-user-{next(self._subjects) % SUBJECTS}"

    def start_replica(self):
        return next(self._starts)

    def calm(self, start, end):
        """No fault window touched [start, end] (a window still open has end None)."""
        return all((e is not None and e < start) or s > end for s, e, _ in self.faults)


async def run_op(run, kind, deadline_s):
    """One operation with its deadline: its outcome, `hung` past the deadline."""
    op, _ = KINDS[kind]
    started, detail = time.monotonic(), ""
    try:
        outcome = await asyncio.wait_for(op(run), deadline_s)
    except asyncio.TimeoutError:
        outcome = "hung"
    except Refused as refused:
        outcome, detail = refused.outcome, refused.detail
        run.details.setdefault(outcome, detail)
    except Crossed as crossed:
        print(f"CROSSED {kind}: {crossed}", flush=True)
        outcome = "crossed"
    except httpx2.HTTPError as e:
        outcome = f"transport_{type(e).__name__}"
    except (KeyError, ValueError, TypeError) as e:  # an answer not shaped as the protocol says
        outcome = f"malformed_{type(e).__name__}"
        run.details.setdefault(outcome, f"{kind}: {e!r}")
    run.outcomes[(kind, outcome)] += 1
    if outcome not in SUCCESS and run.calm(started, time.monotonic()):
        run.calm_failures[(kind, outcome)] += 1
        _, end, name = max(run.faults, key=lambda w: w[1], default=(0, started, "none"))
        print(f"not ok outside fault windows: {kind} {outcome} {started - end:.1f} s after the end of "
              f"'{name}': {detail[:160]!r}", flush=True)
    return outcome


def mix():
    return [k for k, (_, weight) in KINDS.items() for _ in range(weight)]


async def worker(run, n, until, max_ops, deadline_s):
    kinds = mix()
    for i in range(max_ops):
        if time.monotonic() >= until:
            return
        if await run_op(run, kinds[(n + i * 7) % len(kinds)], deadline_s) not in SUCCESS:
            await asyncio.sleep(BACKOFF_S)  # a fault fails operations fast: do not spin on it


async def sampler(run, replicas, until):
    """Every second of the load: the highest gauges, descriptors and RSS of each replica."""
    while time.monotonic() < until:
        for i, r in enumerate(replicas):
            try:
                g = await asyncio.to_thread(gauges, r)
                fds, rss = r.usage()
            except (OSError, ValueError):
                continue  # restarting
            for name, v in [*g.items(), ("fds", fds), ("rss_mib", rss // 1024)]:
                run.peaks[(i, name)] = max(run.peaks.get((i, name), 0), v)
        await asyncio.sleep(1)


async def fault(run, name, action):
    """Runs a blocking fault `action` in a thread, as a window other operations may fail in."""
    window = [time.monotonic(), None, name]
    run.faults.append(window)
    print(f"fault: {name}", flush=True)
    await asyncio.to_thread(action)
    window[1] = time.monotonic()


async def chaos(run, args, upstream, replica, collector, t0):
    """The faults, at fixed fractions of the run."""
    duration = args.seconds

    async def at(fraction):
        await asyncio.sleep(max(0.0, t0 + fraction * duration - time.monotonic()))

    await at(0.20)
    window = [time.monotonic(), None, "upstream killed and restarted"]
    run.faults.append(window)
    print("fault: upstream killed", flush=True)
    upstream.kill()
    await at(0.25)
    await collector.switch("down")
    print("collector: down", flush=True)
    await at(0.30)
    await asyncio.to_thread(upstream.start)
    window[1] = time.monotonic()
    print("upstream restarted", flush=True)
    await at(0.50)
    await collector.switch("hung")
    print("collector: hung", flush=True)
    await at(0.55)
    await fault(run, "replica 1 restarted", replica.restart)
    await at(0.75)
    await collector.switch("up")
    print("collector: up", flush=True)


def gauges(replica):
    m = replica.proxy.metrics()
    return {g: m.sum(g) for g in GAUGES}


async def until_settled(replicas, baseline, timeout_s):
    """Polls until every gauge is 0 and descriptors and RSS are back near the baseline (or the
    timeout); (gauges, usage) of each replica at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = [(gauges(r), r.usage()) for r in replicas]
        settled = all(not any(g.values()) and fds <= b[0] + FD_SLACK and rss <= b[1] + RSS_SLACK_KIB
                      for (g, (fds, rss)), b in zip(now, baseline))
        if settled or time.monotonic() >= deadline:
            return now, time.monotonic() - (deadline - timeout_s)
        await asyncio.sleep(1)


def report(run, replicas, baseline, settled, waited, args, elapsed, collector):
    """Prints the figures; the list of reasons the run fails."""
    failures = []
    print(f"\n== soak: {elapsed:.0f} s of load, concurrency {args.concurrency}, binary {args.binary}")
    print("operations by kind and outcome:")
    for kind in KINDS:
        row = {o: n for (k, o), n in sorted(run.outcomes.items()) if k == kind}
        print(f"  {kind:<15} {sum(row.values()):>6}  " + ", ".join(f"{o}={n}" for o, n in row.items()))
    total = sum(run.outcomes.values())
    hung = sum(n for (_, o), n in run.outcomes.items() if o == "hung")
    crossed = sum(n for (_, o), n in run.outcomes.items() if o == "crossed")
    print(f"total {total}; hung {hung}; crossed {crossed}")
    print("not ok outside fault windows: " + (", ".join(f"{k}/{o}={n}" for (k, o), n in sorted(run.calm_failures.items())) or "none"))
    for outcome, detail in sorted(run.details.items()):
        print(f"  {outcome}: {detail[:160]!r}")
    print(f"spans received by the collector: {len(collector.receiver.spans())}")
    failures += [f"{hung} hung operations"] * bool(hung) + [f"{crossed} crossed answers"] * bool(crossed)
    for i, (r, b, (g, (fds, rss))) in enumerate(zip(replicas, baseline, settled)):
        peak = {name: v for (j, name), v in run.peaks.items() if j == i}
        print(f"replica {i}: fds {b[0]} -> peak {peak.get('fds')} -> {fds}, RSS {b[1] // 1024} -> peak "
              f"{peak.get('rss_mib')} -> {rss // 1024} MiB; gauges, peak under load -> after {waited:.0f} s quiet: "
              + ", ".join(f"{k}={peak.get(k, 0):g}->{v:g}" for k, v in g.items()))
        if any(g.values()):
            failures.append(f"replica {i}: gauges not back to 0: {g}")
        if fds > b[0] + FD_SLACK or rss > b[1] + RSS_SLACK_KIB:
            failures.append(f"replica {i}: descriptors/RSS not back ({fds} fds, {rss} KiB)")
        if r.proxy.proc.p.poll() is not None or r.panicked() or any(c != 0 for c in r.exits):
            failures.append(f"replica {i} crashed or panicked (restart exits {r.exits})")
    return failures


async def soak(args, tmp):
    issuer = Issuer(tmp / "jwks.json")
    upstream, collector = Upstream(), Collector()
    await collector.switch("up")
    ports = [free_port(), free_port()]
    config = tmp / "replica.toml"
    config.write_text(replica_toml(ports, collector.port, issuer.jwks_path, args.state_ttl, args.task_ttl))
    replicas = [Replica(upstream.url, config, p) for p in ports]
    limits = httpx2.Limits(max_connections=4 * args.concurrency)
    try:
        async with httpx2.AsyncClient(timeout=args.deadline * 2, limits=limits) as http:
            run = Run(args, replicas, issuer, http)
            for kind in KINDS:  # warm-up: one of each, before the baseline
                await run_op(run, kind, args.deadline)
            baseline = [r.usage() for r in replicas]
            run.outcomes.clear()
            t0 = time.monotonic()
            until = t0 + args.seconds
            workers = [worker(run, n, until, args.max_ops, args.deadline) for n in range(args.concurrency)]
            await asyncio.gather(chaos(run, args, upstream, replicas[1], collector, t0),
                                 sampler(run, replicas, until), *workers)
            elapsed = time.monotonic() - t0
            settled, waited = await until_settled(replicas, baseline, max(args.state_ttl, args.task_ttl) + args.quiet)
            return report(run, replicas, baseline, settled, waited, args, elapsed, collector)
    finally:
        for i, r in enumerate(replicas):
            r.proxy.kill()
            if args.logs:
                Path(args.logs, f"replica-{i}.log").write_text(getattr(r, "logs_before", "") + r.proxy.proc.output())
        upstream.kill()
        await collector.close()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="how long the load runs")
    p.add_argument("--smoke", action="store_true", help="~40 s in all, fewer operations, the same checks")
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--logs", help="a directory to write the replicas' logs to")
    args = p.parse_args()
    args.seconds = 25 if args.smoke else args.minutes * 60
    args.concurrency = args.concurrency or (6 if args.smoke else 12)
    args.max_ops = 200 if args.smoke else 100_000  # per worker
    args.state_ttl, args.task_ttl = (5, 6) if args.smoke else (10, 12)
    args.deadline = args.task_ttl + 20  # an operation past this is hung
    args.quiet = 20  # beyond the TTLs, for descriptors, sessions and RSS to come back
    import conftest
    args.binary = conftest.proxy_binary()
    return args


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="mrtr-soak-") as tmp:
        failures = asyncio.run(soak(args, Path(tmp)))
    for f in failures:
        print(f"FAIL: {f}")
    print("soak: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

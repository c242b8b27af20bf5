"""A modern client giving up on a call (it closes the response stream, which 2026-07-28 defines as
cancellation) must cancel the call on the legacy upstream: the proxy sends `notifications/cancelled`
and the real Python server cancels the tool. The server-side `was_cancelled` tool waits for that
event, so nothing here sleeps to synchronise.
"""

import asyncio
import itertools

import pytest

from conftest import run_ts_client
from test_modern_clients import PyClient, text_of

_tags = (f"call-{n}" for n in itertools.count())

pytestmark = pytest.mark.parametrize("stack", ["py", "py-sse"], indirect=True)


def abandon_wait_forever(url, tag):
    """Calls `wait_forever(tag)` through `url` and gives up after 2 s; returns "gave up"."""

    async def give_up(c):
        try:
            await asyncio.wait_for(c.call_tool("wait_forever", {"tag": tag}), timeout=2)
        except (asyncio.TimeoutError, TimeoutError):
            return "gave up"
        return "finished?"

    return PyClient(url).run(give_up)


def test_py_client_abandoning_a_call_cancels_it_upstream(stack):
    tag = next(_tags)
    assert abandon_wait_forever(stack["proxy"].url, tag) == "gave up"
    r = PyClient(stack["proxy"].url).run(lambda c: c.call_tool("was_cancelled", {"tag": tag}))
    assert text_of(r) == "cancelled"


def test_ts_client_aborting_a_call_cancels_it_upstream(stack):
    tag = next(_tags)
    out = run_ts_client(
        stack["proxy"].url,
        [
            {"op": "abortedCall", "name": "wait_forever", "arguments": {"tag": tag}, "afterMs": 2000},
            {"op": "callTool", "name": "was_cancelled", "arguments": {"tag": tag}},
        ],
    )
    assert "error" not in out, out
    assert out["results"][0]["aborted"] is True
    assert out["results"][1]["content"][0]["text"] == "cancelled"


"""URL-mode elicitation from a real legacy server (Python mcp 1.30.0): inline `elicitation/create`
with `mode: "url"`, and the -32042 "URL elicitation required" error, both as input_required rounds
for modern clients that declared `elicitation.url`. The legacy `elicitationId` never reaches them.
"""

import itertools

import pytest

from conftest import run_ts_client
from test_modern_clients import PyClient, text_of, ts_text

URL_CAPS = {"elicitation": {"form": {}, "url": {}}}
_accounts = (f"acct-{n}" for n in itertools.count())

pytestmark = pytest.mark.parametrize("stack", ["py"], indirect=True)


class UrlClient(PyClient):
    """Records the URL-mode requests its callback saw."""

    def __init__(self, url):
        super().__init__(url, sampling=False, roots=False)
        self.seen = []

    async def _elicit(self, ctx, params):
        self.seen.append(params.model_dump(by_alias=True, exclude_none=True))
        return await super()._elicit(ctx, params)


def test_inline_url_elicitation(stack):
    client = UrlClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("url_sign_in", {}))) == "sign-in: accept"
    assert len(client.seen) == 1
    seen = client.seen[0]
    assert seen["mode"] == "url" and seen["url"] == "https://example.com/sign-in"
    assert "elicitationId" not in seen
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "url_sign_in"}], URL_CAPS)
    assert ts_text(out["results"][0]) == "sign-in: accept"
    assert out["counts"]["elicitation"] == 1


def test_url_elicitation_required_error_becomes_a_round_and_the_call_is_reissued(stack):
    client = UrlClient(stack["proxy"].url)
    account = next(_accounts)
    r = client.run(lambda c: c.call_tool("needs_authorization", {"account": account}))
    assert text_of(r) == f"authorized {account}"
    assert [s["url"] for s in client.seen] == [f"https://example.com/authorize?account={account}"]
    account = next(_accounts)
    out = run_ts_client(
        stack["proxy"].url,
        [{"op": "callTool", "name": "needs_authorization", "arguments": {"account": account}}],
        URL_CAPS,
    )
    assert ts_text(out["results"][0]) == f"authorized {account}"
    assert out["counts"]["elicitation"] == 1


def test_url_elicitation_without_the_url_capability_is_32021(stack):
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "url_sign_in"}], {"elicitation": {"form": {}}})
    assert out.get("code") == -32021, out

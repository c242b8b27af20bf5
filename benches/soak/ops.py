"""One function per kind of soak operation. Each takes the run's context, returns its outcome
(`ok`, `declined`, `cancelled`, `expired`, `abandoned`) or raises `Refused(outcome)`, and raises
`Crossed` when an answer does not carry the operation's own nonce. Modern legs alternate between
the replicas and each carries a freshly minted token of the same subject."""

import asyncio
import time

from wire import TASKS_CAPS, Crossed, Refused, check, expect_nonces, legacy_http_echo, legacy_sse_echo
from wire import modern, text_of

MAX_ROUNDS = 4
DECLINED = "Not approved: nothing summarized."


def answer_for(request, value, approve=True):
    """The client's answer to one server request of a round: an approval, a form, a sample."""
    if request.get("method") == "sampling/createMessage":
        return {"role": "assistant", "content": {"type": "text", "text": value}, "model": "soak"}
    if is_approval(request):
        return {"action": "accept", "content": {"approve": True}} if approve else {"action": "decline"}
    return {"action": "accept", "content": {"name": value}}


class Leg:
    """The legs of one call: each on the next replica, each with a refreshed token."""

    def __init__(self, ctx, caps=None):
        self.ctx, self.caps, self.n = ctx, caps, ctx.start_replica()
        self.subject = ctx.subject()
        self.trail = []  # (replica, what came back) of each leg, for a crossed answer's report

    async def send(self, method, params):
        replica = self.n % len(self.ctx.urls)
        self.n += 1
        kwargs = {"caps": self.caps} if self.caps else {}
        token = self.ctx.issuer.token(self.subject)
        status, answer = await modern(self.ctx.http, self.ctx.urls[replica], method, params, token, **kwargs)
        result = check(status, answer)
        asked = [r.get("method") for r in result.get("inputRequests", {}).values()]
        self.trail.append((replica, result.get("resultType"), asked))
        return result

    def expect(self, text, nonces):
        try:
            expect_nonces(text, nonces)
        except Crossed as crossed:
            raise Crossed(f"{crossed}; legs {self.trail}") from None


def is_approval(request):
    return "approve" in request.get("params", {}).get("requestedSchema", {}).get("properties", {})


async def rounds(leg, tool, arguments, nonce, approve=True):
    """Runs a modern call through its input_required rounds: (result, the answers given to the
    tool's own questions, how many approvals were asked). Every approval question must name
    the call's nonce (the gate's message quotes the argument)."""
    params = {"name": tool, "arguments": arguments}
    given, approvals = [], 0
    result = await leg.send("tools/call", params)
    for _ in range(MAX_ROUNDS):
        if result.get("resultType") != "input_required":
            return result, given, approvals
        responses = {}
        for n, (key, request) in enumerate(result["inputRequests"].items()):
            value = f"{nonce}-{len(given) + approvals}-{n}"
            if is_approval(request):
                approvals += 1
                message = request["params"].get("message", "")
                if nonce not in message:
                    raise Crossed(f"approval question {message!r} is not about {nonce}")
            else:
                given.append(value)
            responses[key] = answer_for(request, value, approve)
        result = await leg.send("tools/call", {**params, "requestState": result["requestState"],
                                               "inputResponses": responses})
    raise Refused("too_many_rounds")


async def mrtr_call(ctx):
    """ask_name (one round) or twice (two rounds): the result names every answer given."""
    nonce = ctx.nonce()
    tool = "twice" if int(nonce[1:]) % 2 else "ask_name"
    leg = Leg(ctx)
    result, given, _ = await rounds(leg, tool, {}, nonce)
    leg.expect(text_of(result), given)
    return "ok"


async def mrtr_abandoned(ctx):
    """A first leg whose call is left parked: it must expire with `state.ttl`."""
    result = await Leg(ctx).send("tools/call", {"name": "ask_name", "arguments": {}})
    if result.get("resultType") != "input_required":
        raise Refused("not_parked")
    return "abandoned"


async def gated_call(ctx):
    """summarize(nonce), gated: approved (then a sampling round) or declined."""
    nonce = ctx.nonce()
    approve = int(nonce[1:]) % 3 != 0
    leg = Leg(ctx)
    result, given, approvals = await rounds(leg, "summarize", {"text": nonce}, nonce, approve)
    if not approve:
        if not result.get("isError") or text_of(result) != DECLINED:
            raise Crossed(f"a declined call answered {result!r}")
        return "declined"
    leg.expect(text_of(result), given)
    # Asked twice: the approval's retry reached a replica that could not find the one that
    # asked (gone, or not known yet), which asks again rather than trust a lost approval.
    return "ok" if approvals == 1 else "ok_approval_asked_again"


async def start_task(leg, tool, arguments):
    result = await leg.send("tools/call", {"name": tool, "arguments": arguments})
    if result.get("resultType") != "task":
        raise Refused("not_a_task")
    return result["taskId"]


async def poll_task(ctx, leg, task_id, done):
    """tasks/get (on alternating replicas) until `done(task)`, within the operation's deadline."""
    while True:
        task = await leg.send("tasks/get", {"taskId": task_id})
        if task.get("taskId", task_id) != task_id:
            raise Crossed(f"tasks/get {task_id} answered {task.get('taskId')}")
        if done(task):
            return task
        await asyncio.sleep(ctx.poll_s)


async def task_answered(ctx):
    """slow_ask as a task: wait for its question, answer it with tasks/update, read the result."""
    nonce = ctx.nonce()
    leg = Leg(ctx, TASKS_CAPS)
    task_id = await start_task(leg, "slow_ask", {"delay_ms": 100})
    task = await poll_task(ctx, leg, task_id, lambda t: t["status"] != "working")
    if task["status"] == "input_required":
        responses = {k: answer_for(r, nonce) for k, r in task["inputRequests"].items()}
        await leg.send("tasks/update", {"taskId": task_id, "inputResponses": responses})
        task = await poll_task(ctx, leg, task_id, lambda t: t["status"] not in ("working", "input_required"))
    if task["status"] != "completed":
        raise Refused(f"task_{task['status']}")
    leg.expect(text_of(task.get("result", {})), [nonce])
    return "ok"


async def task_cancelled(ctx):
    """wait_forever as a task, cancelled with tasks/cancel."""
    leg = Leg(ctx, TASKS_CAPS)
    task_id = await start_task(leg, "wait_forever", {"tag": ctx.nonce()})
    await leg.send("tasks/cancel", {"taskId": task_id})
    await poll_task(ctx, leg, task_id, lambda t: t["status"] == "cancelled")
    return "cancelled"


async def task_expired(ctx):
    """slow_ask as a task, never answered: tasks/get must say it is gone after `tasks.ttl`."""
    leg = Leg(ctx, TASKS_CAPS)
    task_id = await start_task(leg, "slow_ask", {"delay_ms": 100})
    gone_by = time.monotonic() + ctx.task_ttl_s
    while True:
        try:
            await leg.send("tasks/get", {"taskId": task_id})
        except Refused as refused:
            if refused.outcome.endswith("rpc_-32602") and time.monotonic() >= gone_by - 1:
                return "expired"
            raise
        await asyncio.sleep(max(ctx.poll_s, 0.5))


async def legacy_http(ctx):
    await legacy_http_echo(ctx.http, ctx.urls[ctx.start_replica() % 2], ctx.issuer.token(ctx.subject()), ctx.nonce())
    return "ok"


async def legacy_sse(ctx):
    await legacy_sse_echo(ctx.http, ctx.bases[ctx.start_replica() % 2], ctx.issuer.token(ctx.subject()), ctx.nonce())
    return "ok"


# Kind → (operation, weight): how often each kind comes in the mix.
KINDS = {
    "mrtr": (mrtr_call, 4),
    "mrtr_abandoned": (mrtr_abandoned, 1),
    "gated": (gated_call, 3),
    "task_answered": (task_answered, 2),
    "task_cancelled": (task_cancelled, 1),
    "task_expired": (task_expired, 1),
    "legacy_http": (legacy_http, 2),
    "legacy_sse": (legacy_sse, 2),
}

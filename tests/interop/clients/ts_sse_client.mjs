// A 2024-11-05 HTTP+SSE client on the official TypeScript SDK (@modelcontextprotocol/sdk 1.32.2:
// SSEClientTransport + Client), driven by a list of operations, answering the server's requests
// through its own handlers. Prints one JSON line of results at the end.
// Usage: node ts_sse_client.mjs SSE_URL '<ops JSON>'  (or `run(argv, io)` under driven.mjs)
// ops: as py_sse_client.py's (ping, listTools, callTool, progress, cancel, heldCall, wait);
// `cancel` aborts the call with an AbortSignal, on which the SDK sends notifications/cancelled.
// Every call has a 20 s timeout. The output line: {"protocol","server","session" (the endpoint's
// sessionId),"endpoint" (path and query of the POST URL),"results","counts",
// "http":[[method,status,path]…],"closed":true} — "closed" once client.close() (which closes the
// stream) returned — or "error" when the session itself failed.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { bounded, byHand, isMain } from './driven.mjs';

const CALL_TIMEOUT_MS = 20_000;
const RUN_TIMEOUT_MS = 55_000;

export async function run(argv, io) {
  const [url, opsJson] = argv;
  const ops = JSON.parse(opsJson);
  const counts = { elicitation: 0, sampling: 0, roots: 0 };
  const http = [];
  const out = { results: [], counts, http };

  // A HELD or WAITING stop, released by the test.
  const stopHere = (word) => io.stop(word, { session: out.session ?? null });

  // Every HTTP exchange, and the POST URL the stream's `endpoint` event named. The client waits for
  // every request in flight before it closes (close() cuts off a POST whose answer came first on
  // the stream).
  const inFlight = new Set();
  const recordingFetch = (input, init) => {
    const exchange = (async () => {
      const target = new URL(input instanceof Request ? input.url : String(input));
      const response = await fetch(input, init);
      const method = init?.method ?? 'GET';
      http.push([method, response.status, target.pathname + target.search]);
      if (method === 'POST' && out.endpoint === undefined) {
        out.endpoint = target.pathname + target.search;
        out.session = target.searchParams.get('sessionId');
      }
      return response;
    })();
    inFlight.add(exchange);
    const forget = () => inFlight.delete(exchange);
    exchange.then(forget, forget);
    return exchange;
  };
  const transport = new SSEClientTransport(new URL(url), { fetch: recordingFetch });
  // Client.connect hands the version the server's initialize answer negotiated to the transport.
  const setProtocolVersion = transport.setProtocolVersion.bind(transport);
  transport.setProtocolVersion = (version) => {
    out.protocol = version;
    setProtocolVersion(version);
  };

  let holdNextElicitation = false;
  const client = new Client({ name: 'ts-sse-client', version: '1.0.0' }, { capabilities: { elicitation: {}, sampling: {}, roots: {} } });
  client.setRequestHandler(ElicitRequestSchema, async () => {
    counts.elicitation++;
    if (holdNextElicitation) {
      holdNextElicitation = false;
      await stopHere('HELD');
    }
    return { action: 'accept', content: { name: 'Dennis' } };
  });
  client.setRequestHandler(CreateMessageRequestSchema, async () => {
    counts.sampling++;
    return { role: 'assistant', content: { type: 'text', text: 'ts-sse-sampled' }, model: 'ts-sse-model' };
  });
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    counts.roots++;
    return { roots: [{ uri: 'file:///ts-sse/root', name: 'ts-sse' }] };
  });

  const textOf = (r) => ({ text: r.content?.find((c) => c.type === 'text')?.text ?? null, isError: Boolean(r.isError) });
  const call = (op, extra = {}) => client.callTool({ name: op.name, arguments: op.arguments ?? {} }, undefined, { timeout: CALL_TIMEOUT_MS, ...extra });

  async function runOp(op) {
    switch (op.op) {
      case 'ping':
        await client.ping();
        return {};
      case 'listTools':
        return { tools: (await client.listTools()).tools.map((t) => t.name) };
      case 'callTool':
        return textOf(await call(op));
      case 'progress': {
        const seen = [];
        const r = await call(op, { onprogress: (p) => seen.push(p) });
        return { ...textOf(r), progress: seen.map((p) => p.progress), totals: seen.map((p) => p.total) };
      }
      case 'cancel': {
        const signal = AbortSignal.timeout(op.afterMs);
        try {
          const r = await call({ name: 'wait_forever', arguments: { tag: op.tag } }, { signal });
          return { gaveUp: false, ...textOf(r) };
        } catch (e) {
          return { gaveUp: signal.aborted, message: String(e?.message ?? e) };
        }
      }
      case 'heldCall':
        holdNextElicitation = true;
        return textOf(await call(op));
      case 'wait':
        await stopHere('WAITING');
        return {};
      default:
        throw new Error(`unknown op ${op.op}`);
    }
  }

  io.onCancel(() => client.close());

  async function session() {
    try {
      await client.connect(transport);
      out.server = client.getServerVersion()?.name;
      for (const op of ops) {
        try {
          out.results.push(await runOp(op));
        } catch (e) {
          out.results.push({ error: `${e?.name ?? 'Error'}: ${e?.message ?? e}`, ...(e?.code !== undefined && { code: e.code }) });
        }
      }
      await Promise.allSettled([...inFlight]);
      await client.close();
      out.closed = true;
    } catch (e) {
      out.error = `${e?.name ?? 'Error'}: ${e?.message ?? e}`;
    }
    return out;
  }

  return bounded(RUN_TIMEOUT_MS, session, () => ({ ...out, error: 'client timed out' }), () => client.close());
}

if (isMain(import.meta.url)) byHand(run);

// A legacy Streamable HTTP client on the official TypeScript SDK (@modelcontextprotocol/sdk 1.32.2:
// StreamableHTTPClientTransport + Client), driven by a list of operations, answering the server's
// requests through its own handlers. Prints one JSON line of results at the end.
// Usage: node ts_legacy_matrix_client.mjs URL '<ops JSON>' ['<options JSON>']  (or `run(argv, io)`
// under driven.mjs)
// options: {"version": "2025-06-18"}  the protocolVersion its initialize asks for (default: the SDK's)
// ops: the same as py_legacy_matrix_client.py's (listTools, callTool, progress, cancel, heldCall,
// concurrent, wait); `cancel` aborts the call with an AbortSignal, on which the SDK sends notifications/cancelled.
// Every call has a 20 s timeout. The output line: {"protocol","session","server","results","counts",
// "http":[[method,status]…],"closed":true}; the close is terminateSession() (DELETE), then close().
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { bounded, byHand, isMain } from './driven.mjs';

const CALL_TIMEOUT_MS = 20_000;
const RUN_TIMEOUT_MS = 55_000;

export async function run(argv, io) {
  const [url, opsJson, optionsJson] = argv;
  const ops = JSON.parse(opsJson);
  const options = JSON.parse(optionsJson ?? '{}');
  const counts = { elicitation: 0, sampling: 0, roots: 0 };
  const http = [];
  const out = { results: [], counts, http };

  const recordingFetch = async (input, init) => {
    const response = await fetch(input, init);
    http.push([init?.method ?? 'GET', response.status]);
    return response;
  };
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch });
  if (options.version) {
    // Client.connect always asks for the SDK's latest version; a 1.x client pins an older one here.
    const send = transport.send.bind(transport);
    transport.send = (message, opts) => {
      if (message.method === 'initialize') message = { ...message, params: { ...message.params, protocolVersion: options.version } };
      return send(message, opts);
    };
  }

  // A HELD or WAITING stop, released by the test.
  const announceAndWait = (word) => io.stop(word, { session: transport.sessionId });

  let holdNextElicitation = false;
  const client = new Client({ name: 'ts-legacy-matrix-client', version: '1.0.0' }, { capabilities: { elicitation: {}, sampling: {}, roots: {} } });
  client.setRequestHandler(ElicitRequestSchema, async () => {
    counts.elicitation++;
    if (holdNextElicitation) {
      holdNextElicitation = false;
      await announceAndWait('HELD');
    }
    return { action: 'accept', content: { name: 'Ken' } };
  });
  client.setRequestHandler(CreateMessageRequestSchema, async () => {
    counts.sampling++;
    return { role: 'assistant', content: { type: 'text', text: 'ts-legacy-sampled' }, model: 'ts-legacy-model' };
  });
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    counts.roots++;
    return { roots: [{ uri: 'file:///ts-legacy/root', name: 'ts-legacy' }] };
  });

  const textOf = (r) => ({ text: r.content?.find((c) => c.type === 'text')?.text ?? null, isError: Boolean(r.isError) });
  const call = (op, extra = {}) => client.callTool({ name: op.name, arguments: op.arguments ?? {} }, undefined, { timeout: CALL_TIMEOUT_MS, ...extra });

  async function runOp(op) {
    switch (op.op) {
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
      case 'concurrent':
        return { results: await Promise.all(op.ops.map(runGuarded)) };
      case 'wait':
        await announceAndWait('WAITING');
        return {};
      default:
        throw new Error(`unknown op ${op.op}`);
    }
  }

  async function runGuarded(op) {
    try {
      return await runOp(op);
    } catch (e) {
      // StreamableHTTPError carries the HTTP status as `code`, McpError the JSON-RPC code.
      return { error: `${e?.name ?? 'Error'}: ${e?.message ?? e}`, ...(e?.code !== undefined && { code: e.code }) };
    }
  }

  io.onCancel(() => client.close());

  async function session() {
    try {
      await client.connect(transport);
      out.protocol = transport.protocolVersion;
      out.session = transport.sessionId;
      out.server = client.getServerVersion()?.name;
      for (const op of ops) out.results.push(await runGuarded(op));
      try {
        await transport.terminateSession();
      } catch (e) {
        out.deleteError = String(e?.message ?? e);
      }
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

// A modern client on the official TypeScript SDK (@modelcontextprotocol/client 2.4.0), pinned to
// 2026-07-28 (no legacy fallback), auto-fulfilling input_required rounds through its handlers.
// Usage: node ts_modern_client.mjs URL '<ops JSON>' ['<capabilities JSON>']  (or `run(argv, io)`
// under driven.mjs)
// ops: [{"op":"callTool","name":..,"arguments":{..}} | {"op":"getPrompt",..} | {"op":"readResource","uri":..}
//       | {"op":"listTools"} | {"op":"discover"} | {"op":"progress", ...callTool args}
//       | {"op":"listen","filter":{..},"call":{"name":..,"arguments":{..}},"wait":"notifications/..."}
//       | {"op":"abortedCall","name":..,"arguments":{..},"afterMs":N}]
// listen: opens subscriptions/listen, makes the call, waits for the `wait` notification, closes.
// abortedCall: starts the call and aborts it (AbortSignal) after N ms; records the error.
// Prints one JSON line: {"results":[...]} or {"error":"..."}; the handlers' calls are counted.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { bounded, byHand, isMain } from './driven.mjs';

const RUN_TIMEOUT_MS = 50_000;

export async function run(argv, io) {
  const [url, opsJson, capsJson] = argv;
  const ops = JSON.parse(opsJson);
  const capabilities = JSON.parse(capsJson ?? '{"elicitation":{"form":{}},"sampling":{},"roots":{}}');
  const counts = { elicitation: 0, sampling: 0, roots: 0 };

  const client = new Client(
    { name: 'ts-modern-client', version: '1.0.0' },
    { capabilities, versionNegotiation: { mode: { pin: '2026-07-28' } }, inputRequired: { autoFulfill: true, maxRounds: 10 } },
  );
  if (capabilities.elicitation) {
    client.setRequestHandler('elicitation/create', async () => {
      counts.elicitation++;
      return { action: 'accept', content: { name: 'Grace' } };
    });
  }
  if (capabilities.sampling) {
    client.setRequestHandler('sampling/createMessage', async () => {
      counts.sampling++;
      return { role: 'assistant', content: { type: 'text', text: 'ts-sampled' }, model: 'ts-model' };
    });
  }
  if (capabilities.roots) {
    client.setRequestHandler('roots/list', async () => {
      counts.roots++;
      return { roots: [{ uri: 'file:///ts/root', name: 'ts' }] };
    });
  }

  io.onCancel(() => client.close());

  async function session() {
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    const results = [];
    for (const op of ops) {
      if (op.op === 'callTool') results.push(await client.callTool({ name: op.name, arguments: op.arguments ?? {} }));
      else if (op.op === 'progress') {
        const progress = [];
        const r = await client.callTool({ name: op.name, arguments: op.arguments ?? {} }, { onprogress: (p) => progress.push(p) });
        results.push({ result: r, progress });
      } else if (op.op === 'getPrompt') results.push(await client.getPrompt({ name: op.name, arguments: op.arguments ?? {} }));
      else if (op.op === 'readResource') results.push(await client.readResource({ uri: op.uri }));
      else if (op.op === 'listen') {
        const seen = new Promise((resolve) => client.setNotificationHandler(op.wait, (n) => resolve(n)));
        const sub = await client.listen(op.filter);
        const call = await client.callTool({ name: op.call.name, arguments: op.call.arguments ?? {} });
        const event = await seen;
        await sub.close();
        results.push({ honored: sub.honoredFilter, call, event });
      } else if (op.op === 'abortedCall') {
        const signal = AbortSignal.timeout(op.afterMs);
        try {
          await client.callTool({ name: op.name, arguments: op.arguments ?? {} }, { signal });
          results.push({ aborted: false });
        } catch (e) {
          results.push({ aborted: signal.aborted, error: String(e?.message ?? e) });
        }
      } else if (op.op === 'listTools') results.push(await client.listTools());
      else if (op.op === 'listPrompts') results.push(await client.listPrompts());
      else if (op.op === 'listResources') results.push(await client.listResources());
      else if (op.op === 'discover') results.push({ version: client.getNegotiatedProtocolVersion?.(), server: client.getServerVersion(), capabilities: client.getServerCapabilities() });
      else throw new Error(`unknown op ${op.op}`);
    }
    const outcome = { results, counts };
    await client.close();
    return outcome;
  }

  const guarded = () => session().catch((e) => ({ error: String(e?.message ?? e), code: e?.code, counts }));
  return bounded(RUN_TIMEOUT_MS, guarded, () => ({ error: 'client timed out' }), () => client.close());
}

if (isMain(import.meta.url)) byHand(run);

// A client of the tasks extension (io.modelcontextprotocol/tasks) on the official packages:
// @modelcontextprotocol/ext-tasks 0.2.2 over @modelcontextprotocol/client 2.4.0, pinned to
// 2026-07-28. The SDK Client discovers the server (the extension must be advertised, or ext-tasks
// sees no task support); ext-tasks frames tools/call and tasks/* and drives the task; we carry
// them over HTTP (its `rawDispatch`) and record every exchange on the wire.
//
// Usage: node ts_tasks_client.mjs URL '<plan JSON>'  (or `run(argv, io)` under driven.mjs)
// plan: {"tool": name, "arguments": {..}, "mode": "settle" | "partial" | "cancel"}
//   settle  (default) ext-tasks drives the call: MRTR rounds first, then tasks/get polling and
//           tasks/update, to the outcome
//   partial we drive the task (tasks/get, tasks/update): once it lists two or more inputRequests,
//           the first key is answered alone, then the rest
//   cancel  tasks/cancel as soon as the call is a task, then tasks/get until the task has ended
// Every form is accepted with {"name": "Grace"}; sampling answers "ts-sampled"; roots file:///ts/root.
// Prints one JSON transcript: kind ("task" | "immediate"), taskId, events (task snapshots the
// client saw), inputs (the requests it answered), outcome, wire (every HTTP exchange), error.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient, DispatchError } from '@modelcontextprotocol/ext-tasks/client';
import { bounded, byHand, isMain } from './driven.mjs';

const PROTOCOL_VERSION = '2026-07-28';
const RUN_TIMEOUT_MS = 30_000;
const clientInfo = { name: 'ts-tasks-client', version: '1.0.0' };
const clientCapabilities = { elicitation: { form: {} }, sampling: {}, roots: {} };

export async function run(argv, io) {
  const [url, planJson] = argv;
  const plan = JSON.parse(planJson);
  const mode = plan.mode ?? 'settle';

  const t0 = Date.now();
  const transcript = { tool: plan.tool, mode, events: [], inputs: [], wire: [] };
  const pendingReads = [];

  // Every request the SDK Client or our dispatch makes goes through here: the request, then its
  // answer (JSON, or the JSON-RPC messages of an SSE body), read from a clone.
  async function recordingFetch(input, init = {}) {
    const headers = Object.fromEntries(new Headers(init.headers).entries());
    const entry = {
      t: Date.now() - t0,
      http: init.method ?? 'GET',
      headers: Object.fromEntries(Object.entries(headers).filter(([k]) => k.startsWith('mcp-'))),
      request: init.body ? JSON.parse(init.body) : undefined,
    };
    transcript.wire.push(entry);
    const res = await fetch(input, init);
    entry.status = res.status;
    entry.contentType = res.headers.get('content-type');
    pendingReads.push(
      res
        .clone()
        .text()
        .then((text) => (entry.response = parseBody(text, entry.contentType)))
        .catch(() => {}),
    );
    return res;
  }

  // A JSON body, or the JSON-RPC messages of an SSE body (a list).
  function parseBody(text, contentType) {
    if (!text) return undefined;
    if (!(contentType ?? '').includes('text/event-stream')) return JSON.parse(text);
    const messages = [];
    for (const event of text.split(/\r?\n\r?\n/)) {
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data.trim()) messages.push(JSON.parse(data));
    }
    return messages;
  }

  // ext-tasks hands over tools/call and tasks/* framed already (_meta: protocol version, client
  // info, capabilities with the extension); we add the JSON-RPC id and the mirrored headers
  // (Mcp-Name: the tool here, the task id from ext-tasks' context on tasks/*).
  let nextId = 1;
  async function rawDispatch(request, options = {}) {
    const id = `tasks-${nextId++}`;
    const headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': PROTOCOL_VERSION,
      'mcp-method': request.method,
    };
    if (request.method === 'tools/call') headers['mcp-name'] = request.params.name;
    for (const [k, v] of Object.entries(options.context?.headers ?? {})) headers[k.toLowerCase()] = v;
    let res;
    try {
      res = await recordingFetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id, ...request }),
        signal: options.signal,
      });
    } catch (error) {
      if (options.signal?.aborted) throw error;
      throw new DispatchError(`POST failed: ${error.message}`, false, { cause: error });
    }
    const body = parseBody(await res.text(), res.headers.get('content-type'));
    const msg = Array.isArray(body) ? body.find((m) => m.id === id && ('result' in m || 'error' in m)) : body;
    if (msg?.error) return { kind: 'error', error: msg.error };
    if (msg && 'result' in msg) return { kind: 'result', result: msg.result };
    throw new DispatchError(`no JSON-RPC response to ${request.method} (HTTP ${res.status})`, false);
  }

  const INPUT_KIND = { 'elicitation/create': 'elicitation', 'sampling/createMessage': 'sampling', 'roots/list': 'roots' };

  function answer(kind) {
    if (kind === 'elicitation') return { action: 'accept', content: { name: 'Grace' } };
    if (kind === 'sampling') {
      return { role: 'assistant', content: { type: 'text', text: 'ts-sampled' }, model: 'ts-model' };
    }
    return { roots: [{ uri: 'file:///ts/root', name: 'ts' }] };
  }

  function recordInput(scope, delivery, key, kind, params) {
    transcript.inputs.push({ scope, delivery, key, kind, ...(params?.message ? { message: params.message } : {}) });
  }

  function recordSnapshot(view) {
    const inputKeys = view.raw.inputRequests ? Object.keys(view.raw.inputRequests) : undefined;
    transcript.events.push({
      t: Date.now() - t0,
      status: view.status,
      ...(view.statusMessage ? { statusMessage: view.statusMessage } : {}),
      ...(inputKeys ? { inputKeys } : {}),
    });
  }

  const errorJson = (e) => ({
    message: e?.message ?? String(e),
    ...(e?.code !== undefined ? { code: e.code } : {}),
    ...(e?.data !== undefined ? { data: e.data } : {}),
  });

  function outcomeJson(outcome) {
    if (outcome.status === 'completed') return { status: 'completed', result: outcome.result };
    if (outcome.status === 'failed') return { status: 'failed', error: errorJson(outcome.error) };
    return { status: outcome.status };
  }

  // The wait before the next tasks/get: the interval the task suggests.
  const pause = (view) => new Promise((resolve) => setTimeout(resolve, view.suggestedPollIntervalMs ?? 100));

  // Polls a task until its status is final; returns that status.
  async function pollToEnd(controller) {
    for (;;) {
      const view = await controller.snapshot();
      recordSnapshot(view);
      if (['completed', 'failed', 'cancelled'].includes(view.status)) return view.status;
      await pause(view);
    }
  }

  // partial: polls the task and answers by hand. The first time it
  // lists two or more requests, only the first key is answered; every later request at once.
  async function driveByHand(controller) {
    const answered = new Set();
    let split = false;
    for (;;) {
      const view = await controller.snapshot();
      recordSnapshot(view);
      if (view.status === 'completed') return { status: 'completed', result: view.raw.result };
      if (view.status === 'failed') return { status: 'failed', error: view.raw.error };
      if (view.status === 'cancelled') return { status: 'cancelled' };
      const open = Object.entries(view.raw.inputRequests ?? {}).filter(([k]) => !answered.has(k));
      if (view.status === 'input_required' && (split || open.length >= 2)) {
        const now = split ? open : open.slice(0, 1);
        if (!split) transcript.partial = { answered: now.map(([k]) => k), leftOpen: open.slice(1).map(([k]) => k) };
        split = true;
        const responses = {};
        for (const [key, req] of now) {
          const kind = INPUT_KIND[req.method];
          recordInput('task', 'manual-update', key, kind, req.params);
          responses[key] = answer(kind);
          answered.add(key);
        }
        await controller.update(responses);
      }
      await pause(view);
    }
  }

  let client;
  async function drive() {
    client = new Client(clientInfo, {
      capabilities: { ...clientCapabilities, extensions: { 'io.modelcontextprotocol/tasks': {} } },
      // server/discover must list 2026-07-28: no initialize, no fallback to the legacy era.
      versionNegotiation: { mode: { pin: PROTOCOL_VERSION } },
    });
    io.onCancel(() => client.close());
    await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch }));
    const session = createTaskSessionFromClient(client, {
      endpointId: url,
      rawDispatch,
      v2RequestFraming: { protocolVersion: PROTOCOL_VERSION, clientInfo, clientCapabilities },
      onError: (e) => (transcript.backgroundErrors ??= []).push(errorJson(e)),
      // MRTR rounds before the task (scope "request") and task inputs (scope "task") alike.
      onInputRequest: async (request, context) => {
        recordInput(context.scope, context.delivery, context.inputId, request.kind, request.params);
        return answer(request.kind);
      },
    });
    transcript.taskSupport = session.capabilities.execution ? 'advertised' : 'none';
    try {
      // A progress token, so that the upstream's progress can reach the task's statusMessage.
      const execution = await session.callTool(plan.tool, plan.arguments ?? {}, {
        metadata: { progressToken: 'tasks-client' },
      });
      transcript.kind = execution.kind;
      if (execution.kind === 'task') transcript.taskId = execution.handle.taskId;
      if (execution.kind === 'task' && mode === 'partial') {
        await execution.detach();
        transcript.outcome = await driveByHand(session.task(transcript.taskId));
      } else if (execution.kind === 'task' && mode === 'cancel') {
        await execution.cancel();
        transcript.outcome = outcomeJson((await execution.settle()).outcome);
        // Cancellation is eventually consistent (SEP-2663): the task may still be working after
        // the acknowledgement. Poll it to its final status.
        transcript.statusAfterCancel = await pollToEnd(session.task(transcript.taskId));
      } else {
        const { outcome } = await execution.settle({ onEvent: (ev) => ev.type === 'task' && recordSnapshot(ev.task) });
        transcript.outcome = outcomeJson(outcome);
      }
    } finally {
      await session.close();
      await client.close();
    }
  }

  // The answers' bodies are read to their end, except after a timeout (a stream may hang).
  async function finish(readBodies = true) {
    if (readBodies) await Promise.all(pendingReads);
    transcript.elapsedMs = Date.now() - t0;
    return transcript;
  }

  const settled = () =>
    drive().then(
      () => finish(),
      (e) => {
        transcript.error = errorJson(e);
        return finish();
      },
    );
  const late = () => {
    transcript.error = { message: `timed out after ${RUN_TIMEOUT_MS} ms` };
    return finish(false);
  };
  return bounded(RUN_TIMEOUT_MS, settled, late, () => client?.close());
}

if (isMain(import.meta.url)) byHand(run);

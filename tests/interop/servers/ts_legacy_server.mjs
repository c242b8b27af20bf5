// A legacy (2025-11-25) MCP server on the official TypeScript SDK (@modelcontextprotocol/sdk 1.32.2),
// one McpServer per session, the usual express wiring (servers/sessions.mjs). Server requests made with relatedRequestId go
// on the call's POST stream; `ask_name_standalone` makes one without it, which the SDK sends on the
// session's GET stream. With `--json` the transport answers in JSON-response mode (enableJsonResponse:
// no SSE on POSTs, so only standalone requests can reach the client). Binds 127.0.0.1:0 and prints
// `READY <port>` once listening. With `--sse` it serves the deprecated HTTP+SSE transport instead
// (GET /sse, POST /messages?sessionId=…, SSEServerTransport), and with `--stdio` it speaks on
// stdin/stdout (StdioServerTransport) and binds nothing.
import express from 'express';
import { z } from 'zod';
import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { sessionApp } from './sessions.mjs';

const nameSchema = { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// wait_forever(tag) cancellations, shared by every session of this process.
const cancellations = new Map();
function cancellation(tag) {
  if (!cancellations.has(tag)) {
    let resolve;
    const promise = new Promise((r) => (resolve = r));
    cancellations.set(tag, { promise, resolve });
  }
  return cancellations.get(tag);
}

function build() {
  const server = new McpServer({ name: 'ts-legacy-server', version: '1.0.0' }, { instructions: 'TypeScript legacy test server' });
  const raw = server.server;
  const askName = async (extra, message) => {
    const r = await raw.elicitInput({ message, requestedSchema: nameSchema }, { relatedRequestId: extra.requestId });
    return r.action === 'accept' ? r.content.name : `<${r.action}>`;
  };
  const sample = async (extra, text) => {
    const r = await raw.createMessage(
      { messages: [{ role: 'user', content: { type: 'text', text: `Summarize: ${text}` } }], maxTokens: 100 },
      { relatedRequestId: extra.requestId },
    );
    return r.content.type === 'text' ? r.content.text : JSON.stringify(r.content);
  };
  const roots = async (extra) => {
    const r = await raw.listRoots(undefined, { relatedRequestId: extra.requestId });
    return r.roots.map((x) => x.uri).join(', ');
  };
  const text = (t) => ({ content: [{ type: 'text', text: t }] });

  server.registerTool('echo', { description: 'Echoes text', inputSchema: { text: z.string() } }, async ({ text: t }) => text(t));
  server.registerTool('progress', { description: 'Reports progress', inputSchema: { steps: z.number() } }, async ({ steps }, extra) => {
    const token = extra._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      if (token !== undefined) {
        await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps } });
      }
    }
    return text(`done after ${steps} steps`);
  });
  server.registerTool('ask_name', { description: 'Elicits a name once' }, async (extra) => text(`Hello, ${await askName(extra, 'What is your name?')}!`));
  server.registerTool('ask_name_standalone', { description: 'Elicits a name on the GET stream' }, async () => {
    const r = await raw.elicitInput({ message: 'Standalone: your name?', requestedSchema: nameSchema });
    return text(`Hello, ${r.action === 'accept' ? r.content.name : `<${r.action}>`}!`);
  });
  server.registerTool('add_tool', { description: 'Registers a tool (the SDK notifies list_changed)', inputSchema: { name: z.string() } }, async ({ name }) => {
    server.registerTool(name, { description: 'Added at run time' }, async () => text(`I am ${name}`));
    return text(`added ${name}`);
  });
  server.registerTool('summarize', { description: 'Samples a summary', inputSchema: { text: z.string() } }, async ({ text: t }, extra) =>
    text(`Summary: ${await sample(extra, t)}`),
  );
  server.registerTool('list_roots', { description: 'Lists the client roots' }, async (extra) => text(`Roots: ${await roots(extra)}`));
  server.registerTool('everything', { description: 'Elicit + sample + roots at once' }, async (extra) => {
    const [n, s, r] = await Promise.all([askName(extra, 'Name?'), sample(extra, 'everything'), roots(extra)]);
    return text(`name=${n} sample=${s} roots=${r}`);
  });
  server.registerTool('twice', { description: 'Elicits twice in sequence' }, async (extra) => {
    const a = await askName(extra, 'First name?');
    const b = await askName(extra, 'Second name?');
    return text(`${a} and ${b}`);
  });
  server.registerTool('adaptive', { description: 'Elicits if the client can, samples otherwise' }, async (extra) => {
    const caps = raw.getClientCapabilities();
    if (caps?.elicitation) return text(`elicited ${await askName(extra, 'Name?')}`);
    return text(`sampled ${await sample(extra, 'adaptive')}`);
  });
  server.registerTool('slow_ask', { description: 'Works, reports progress, elicits a name, works again', inputSchema: { delay_ms: z.number() } }, async ({ delay_ms }, extra) => {
    await sleep(delay_ms);
    const token = extra._meta?.progressToken;
    if (token !== undefined) {
      await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: 1, total: 2, message: 'Asking for a name' } });
    }
    const name = await askName(extra, 'What is your name?');
    await sleep(delay_ms);
    return text(`Hello, ${name}!`);
  });
  server.registerTool('slow_twice', { description: 'Works before each of two elicitations', inputSchema: { delay_ms: z.number() } }, async ({ delay_ms }, extra) => {
    await sleep(delay_ms);
    const a = await askName(extra, 'First name?');
    await sleep(delay_ms);
    const b = await askName(extra, 'Second name?');
    return text(`${a} and ${b}`);
  });
  server.registerTool('slow_everything', { description: 'Works, then elicits and samples at once', inputSchema: { delay_ms: z.number() } }, async ({ delay_ms }, extra) => {
    await sleep(delay_ms);
    const [n, s] = await Promise.all([askName(extra, 'Name?'), sample(extra, 'everything')]);
    return text(`name=${n} sample=${s}`);
  });
  server.registerTool('ask_then_slow', { description: 'Elicits at once, then works and elicits again', inputSchema: { delay_ms: z.number() } }, async ({ delay_ms }, extra) => {
    const a = await askName(extra, 'First name?');
    await sleep(delay_ms);
    const b = await askName(extra, 'Second name?');
    return text(`${a} and ${b}`);
  });
  server.registerTool('wait_forever', { description: 'Never finishes; records being cancelled under tag', inputSchema: { tag: z.string() } }, async ({ tag }, extra) => {
    await new Promise((resolve, reject) =>
      extra.signal.addEventListener('abort', () => {
        cancellation(tag).resolve();
        // On stderr, which a proxy running this server over stdio logs.
        console.error(`CANCELLED ${tag}`);
        reject(extra.signal.reason);
      }),
    );
    return text('woke up');
  });
  server.registerTool('was_cancelled', { description: 'Waits (at most 20 s) for wait_forever(tag) to be cancelled', inputSchema: { tag: z.string() } }, async ({ tag }) => {
    const cancelled = await Promise.race([cancellation(tag).promise.then(() => true), sleep(20_000).then(() => false)]);
    return text(cancelled ? 'cancelled' : 'not cancelled');
  });
  server.registerPrompt('greeting', { description: 'Asks who to greet' }, async (extra) => ({
    messages: [{ role: 'user', content: { type: 'text', text: `Please greet ${await askName(extra, 'Who should be greeted?')}.` } }],
  }));
  server.registerPrompt('plain_prompt', { description: 'No input needed', argsSchema: { topic: z.string() } }, async ({ topic }) => ({
    messages: [{ role: 'user', content: { type: 'text', text: `Tell me about ${topic}.` } }],
  }));
  server.registerResource('motd', 'data://motd', { mimeType: 'text/plain' }, async (uri) => ({
    contents: [{ uri: uri.href, mimeType: 'text/plain', text: 'Have a nice day' }],
  }));
  server.registerResource('secret', new ResourceTemplate('data://secret/{who}', { list: undefined }), { mimeType: 'text/plain' }, async (uri, { who }, extra) => ({
    contents: [{ uri: uri.href, mimeType: 'text/plain', text: `secret of ${who} for ${await askName(extra, 'Who is asking?')}` }],
  }));
  return server;
}

if (process.argv.includes('--stdio')) {
  await build().connect(new StdioServerTransport());
} else {
  serveHttp(process.argv.includes('--sse'));
}

function serveHttp(sseMode) {
const jsonMode = process.argv.includes('--json');
const sdk = { StreamableHTTPServerTransport, isInitializeRequest };
const app = sessionApp(express, build, sdk, { enableJsonResponse: jsonMode });

const sse = new Map();
if (sseMode) {
  app.get('/sse', async (req, res) => {
    const transport = new SSEServerTransport('/messages', res);
    sse.set(transport.sessionId, transport);
    res.on('close', () => sse.delete(transport.sessionId));
    await build().connect(transport);
  });
  app.post('/messages', async (req, res) => {
    const transport = sse.get(req.query.sessionId);
    if (!transport) {
      res.status(404).send('unknown session');
      return;
    }
    await transport.handlePostMessage(req, res, req.body);
  });
}

const listener = app.listen(0, '127.0.0.1', () => console.log(`READY ${listener.address().port}`));
}

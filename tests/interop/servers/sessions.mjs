// The usual Streamable HTTP wiring of a legacy (SDK 1.x) server on express: an `initialize`
// without a session opens one (a server from `build()` on its own transport, session ids from
// randomUUID); later POSTs, GETs and DELETEs go to their session's transport. It imports no
// package: each server passes its own express and SDK, so a server installed in another package
// (tests/interop/apps) shares the wiring without mixing two copies of the SDK. Returns the app.
import { randomUUID } from 'node:crypto';

export function sessionApp(express, build, { StreamableHTTPServerTransport: Transport, isInitializeRequest }, options = {}) {
  const app = express();
  app.use(express.json());
  const transports = new Map();
  app.post('/mcp', async (req, res) => {
    const sid = req.headers['mcp-session-id'];
    let transport = sid ? transports.get(sid) : undefined;
    if (!transport) {
      if (sid || !isInitializeRequest(req.body)) {
        res.status(400).json({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null });
        return;
      }
      transport = new Transport({
        sessionIdGenerator: () => randomUUID(),
        ...options,
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
      await build().connect(transport);
    }
    await transport.handleRequest(req, res, req.body);
  });
  const session = async (req, res) => {
    const transport = transports.get(req.headers['mcp-session-id']);
    if (!transport) {
      res.status(400).send('Invalid or missing session ID');
      return;
    }
    await transport.handleRequest(req, res);
  };
  app.get('/mcp', session);
  app.delete('/mcp', session);
  return app;
}

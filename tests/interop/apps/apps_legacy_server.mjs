// A legacy MCP Apps server written the way the MCP Apps SDK documents it
// (@modelcontextprotocol/ext-apps 1.7.5 on @modelcontextprotocol/sdk 1.32.2): once the client has
// initialized, `weather` is registered as an app tool (with `_meta.ui.resourceUri`) when
// getUiCapability says the client can render `text/html;profile=mcp-app`, and as a text-only tool
// otherwise. The app's `ui://` resource and a `ping` tool exist for every client (registered
// before connecting: the SDK sets its tool and resource handlers then). The server advertises the
// ui extension in its own capabilities.
// Streamable HTTP (one McpServer per session) on 127.0.0.1:0, printing `READY <port>`; with
// `--stdio` it speaks on stdin/stdout and binds nothing.
import express from 'express';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import {
  EXTENSION_ID,
  RESOURCE_MIME_TYPE,
  getUiCapability,
  registerAppResource,
  registerAppTool,
} from '@modelcontextprotocol/ext-apps/server';
import { sessionApp } from '../servers/sessions.mjs';

const APP_URI = 'ui://weather/app.html';
const APP_HTML = '<!doctype html><title>Weather</title><p id="t">Sunny, 21 °C</p>';
const FORECAST = { city: 'Lisbon', sky: 'sunny', celsius: 21 };

function build() {
  const server = new McpServer(
    { name: 'apps-legacy-server', version: '1.0.0' },
    { capabilities: { extensions: { [EXTENSION_ID]: {} } } },
  );
  server.registerTool('ping', { description: 'Answers pong' }, async () => ({
    content: [{ type: 'text', text: 'pong' }],
  }));
  registerAppResource(server, 'weather-app', APP_URI, {}, async () => ({
    contents: [{ uri: APP_URI, mimeType: RESOURCE_MIME_TYPE, text: APP_HTML }],
  }));
  server.server.oninitialized = () => {
    const ui = getUiCapability(server.server.getClientCapabilities());
    if (ui?.mimeTypes?.includes(RESOURCE_MIME_TYPE)) {
      registerAppTool(
        server,
        'weather',
        { description: 'The weather, with an interactive dashboard', _meta: { ui: { resourceUri: APP_URI } } },
        async () => ({
          content: [{ type: 'text', text: 'Sunny in Lisbon, 21 °C (see the dashboard)' }],
          structuredContent: FORECAST,
        }),
      );
    } else {
      server.registerTool('weather', { description: 'The weather, as text' }, async () => ({
        content: [{ type: 'text', text: 'Sunny in Lisbon, 21 °C' }],
      }));
    }
  };
  return server;
}

if (process.argv.includes('--stdio')) {
  await build().connect(new StdioServerTransport());
} else {
  const app = sessionApp(express, build, { StreamableHTTPServerTransport, isInitializeRequest });
  const listener = app.listen(0, '127.0.0.1', () => console.log(`READY ${listener.address().port}`));
}

// Written by the Squadron worker. An MCP stdio server for the provider's CLI that relays each
// JSON-RPC message to the worker's MCP gateway over the profile's Unix socket, as MCP's
// streamable HTTP with this generation's token. Node is in every sandbox (both CLIs need
// it), and neither CLI speaks HTTP over a Unix socket, hence this bridge.
// Usage: node mcp-bridge.mjs SERVER
import fs from 'node:fs';
import http from 'node:http';
import readline from 'node:readline';

const server = process.argv[2];
const socketPath = process.env.SQUADRON_MCP_SOCKET || '/mnt/broker/mcp.sock';
const tokenFile = process.env.SQUADRON_MCP_TOKEN_FILE || '/mnt/run/mcp-token';
const token = fs.readFileSync(tokenFile, 'utf8').trim();
let session = null;
let protocolVersion = null;

const send = (message) => process.stdout.write(JSON.stringify(message) + '\n');

// A request the gateway or the server refused still gets its JSON-RPC answer, so the CLI
// reports the refusal instead of waiting.
function refuse(message, status, text) {
  if (message && message.id !== undefined) {
    send({ jsonrpc: '2.0', id: message.id,
           error: { code: -32001, message: `MCP gateway answered ${status}: ${text.slice(0, 1000)}` } });
  } else {
    process.stderr.write(`mcp-bridge: ${status}: ${text.slice(0, 1000)}\n`);
  }
}

// One answer to the CLI; the protocol version the server chose at `initialize` goes with
// every later message, as streamable HTTP asks.
function answer(message) {
  const version = message && message.result && message.result.protocolVersion;
  if (typeof version === 'string') protocolVersion = version;
  send(message);
}

// Answers arrive as JSON or as server-sent events, one message per `data:` event; an event
// that is not JSON is reported and skipped, the others still delivered.
function deliver(contentType, body) {
  if (contentType.startsWith('text/event-stream')) {
    for (const event of body.split(/\r?\n\r?\n/)) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart()).join('\n');
      if (!data) continue;
      try { answer(JSON.parse(data)); } catch (e) {
        process.stderr.write(`mcp-bridge: an event that is not JSON: ${String(e)}\n`);
      }
    }
  } else if (body.trim()) {
    answer(JSON.parse(body));
  }
}

function relay(line) {
  return new Promise((resolve) => {
    let message;
    try { message = JSON.parse(line); } catch { resolve(); return; }
    const headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${token}`,
    };
    if (session) headers['mcp-session-id'] = session;
    if (protocolVersion) headers['mcp-protocol-version'] = protocolVersion;
    const request = http.request(
      { socketPath, path: `/mcp/${encodeURIComponent(server)}`, method: 'POST', headers },
      (response) => {
        if (response.headers['mcp-session-id']) session = response.headers['mcp-session-id'];
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk) => { body += chunk; });
        response.on('end', () => {
          try {
            // A session the server no longer knows: the CLI's next initialize starts anew.
            if (response.statusCode === 404 && session) session = null;
            if (response.statusCode >= 400) refuse(message, response.statusCode, body);
            else deliver(response.headers['content-type'] || '', body);
          } catch (e) {
            refuse(message, 502, String(e));
          }
          resolve();
        });
      });
    request.on('error', (e) => { refuse(message, 503, String(e)); resolve(); });
    request.end(line);
  });
}

// One message at a time, in order: MCP's initialize must finish before anything else.
let queue = Promise.resolve();
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  if (line.trim()) queue = queue.then(() => relay(line));
});

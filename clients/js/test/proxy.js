// A WebSocket relay between a client and a real greendot server. It forwards
// every text frame both ways and lets a test add frames of its own (a stale
// presence change, a reconnect advice) or close the client's side with a
// chosen code, which the real server would only do in rare situations.

import { WebSocketServer, WebSocket } from 'ws';

export async function startProxy(upstreamWS) {
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await new Promise((resolve, reject) => {
    wss.once('listening', resolve);
    wss.once('error', reject);
  });
  const conns = [];
  wss.on('connection', (down, req) => {
    const up = new WebSocket(upstreamWS + req.url);
    const conn = {
      url: req.url,
      fromClient: [],
      fromServer: [],
      down,
      up,
      /** Sends frame to the client as if the server had. */
      inject(frame) { down.send(JSON.stringify(frame)); },
      /** Closes the client's side with code (the upstream side is closed normally). */
      close(code, reason = '') {
        down.close(code, reason);
        up.close();
      },
    };
    conns.push(conn);
    const pending = [];
    up.on('open', () => { for (const m of pending.splice(0)) up.send(m); });
    up.on('message', (data, isBinary) => {
      const text = data.toString();
      conn.fromServer.push(text);
      if (down.readyState === WebSocket.OPEN) down.send(isBinary ? data : text);
    });
    down.on('message', (data, isBinary) => {
      const text = data.toString();
      conn.fromClient.push(text);
      if (up.readyState === WebSocket.OPEN) up.send(isBinary ? data : text);
      else if (up.readyState === WebSocket.CONNECTING) pending.push(text);
    });
    up.on('close', (code, reason) => {
      if (down.readyState !== WebSocket.OPEN) return;
      // 1005 and 1006 may not be sent on the wire.
      if (code === 1005 || code === 1006) down.terminate();
      else down.close(code, reason);
    });
    up.on('unexpected-response', (_req, res) => {
      conn.upstreamStatus = res.statusCode;
      down.terminate();
    });
    up.on('error', () => down.terminate());
    down.on('close', () => { if (up.readyState === WebSocket.OPEN || up.readyState === WebSocket.CONNECTING) up.terminate(); });
    down.on('error', () => {});
  });
  const { port } = wss.address();
  return {
    url: `ws://127.0.0.1:${port}`,
    conns,
    /** The newest connection. */
    get last() { return conns[conns.length - 1]; },
    close() {
      for (const c of wss.clients) c.terminate();
      return new Promise((resolve) => wss.close(() => resolve()));
    },
  };
}

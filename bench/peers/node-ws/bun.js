// Bun's built-in WebSocket server (uWebSockets): /ws/echo echoes every text and binary message
// (permessage-deflate when the client offers it). Usage: bun bun.js PORT
const port = Number(process.argv[2] || 8080);
Bun.serve({
  hostname: "127.0.0.1",
  port,
  fetch(req, server) {
    if (new URL(req.url).pathname === "/ws/echo" && server.upgrade(req)) return;
    return new Response("not found", { status: 404 });
  },
  websocket: {
    perMessageDeflate: true,
    message(ws, message) { ws.send(message); },
  },
});

// Bun's built-in WebSocket server (uWebSockets): /ws/echo echoes every text and binary message
// (permessage-deflate when the client offers it); /ws/broadcast is a room (uWebSockets' pub/sub:
// the sender gets its own message too, as the other peers do). Usage: bun bun.js PORT
const port = Number(process.argv[2] || 8080);
const server = Bun.serve({
  hostname: "127.0.0.1",
  port,
  fetch(req, server) {
    const path = new URL(req.url).pathname;
    if ((path === "/ws/echo" || path === "/ws/broadcast")
        && server.upgrade(req, { data: { room: path === "/ws/broadcast" } })) return;
    return new Response("not found", { status: 404 });
  },
  websocket: {
    perMessageDeflate: true,
    open(ws) { if (ws.data.room) ws.subscribe("room"); },
    // The room: uWebSockets' publish, one frame to every subscriber.
    message(ws, message) {
      if (ws.data.room) server.publish("room", message); else ws.send(message);
    },
  },
});

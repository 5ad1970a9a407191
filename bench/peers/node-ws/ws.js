// Node's `ws` peer: /ws/echo echoes every text and binary message (permessage-deflate when the
// client offers it); /ws/broadcast is a room. Usage: node ws.js PORT
const http = require("http");
const { WebSocketServer } = require("ws");
const port = Number(process.argv[2] || 8080);
const server = http.createServer((req, res) => { res.writeHead(404); res.end(); });
const wss = new WebSocketServer({ noServer: true, perMessageDeflate: { threshold: 256 } });
// /ws/broadcast: every message to every member of the room (a member whose buffer holds more
// than 64 KiB misses it, as canter's hub skips a member at its high-water mark).
const room = new Set();
server.on("upgrade", (req, socket, head) => {
  if (req.url === "/ws/echo") {
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.on("message", (data, isBinary) => ws.send(data, { binary: isBinary }));
    });
  } else if (req.url === "/ws/broadcast") {
    wss.handleUpgrade(req, socket, head, (ws) => {
      room.add(ws);
      ws.on("close", () => room.delete(ws));
      ws.on("message", (data, isBinary) => {
        for (const m of room) if (m.bufferedAmount < 65536) m.send(data, { binary: isBinary });
      });
    });
  } else {
    socket.destroy();
  }
});
server.listen(port, "127.0.0.1");

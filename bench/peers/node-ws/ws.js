// Node's `ws` peer: /ws/echo echoes every text and binary message (permessage-deflate when the
// client offers it). Usage: node ws.js PORT
const http = require("http");
const { WebSocketServer } = require("ws");
const port = Number(process.argv[2] || 8080);
const server = http.createServer((req, res) => { res.writeHead(404); res.end(); });
const wss = new WebSocketServer({ noServer: true, perMessageDeflate: { threshold: 256 } });
server.on("upgrade", (req, socket, head) => {
  if (req.url !== "/ws/echo") { socket.destroy(); return; }
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on("message", (data, isBinary) => ws.send(data, { binary: isBinary }));
  });
});
server.listen(port, "127.0.0.1");

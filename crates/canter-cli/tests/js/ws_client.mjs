// Node's built-in WebSocket client (undici) against /ws/echo: text, binary, a 1 MiB message,
// many in flight, then the close handshake. Prints "ok ..." per check and "ALL OK" at the end;
// exits non-zero on the first failure.
const port = process.argv[2];
const ws = new WebSocket(`ws://127.0.0.1:${port}/ws/echo`);
ws.binaryType = "arraybuffer";
const fail = (why) => { console.log("FAIL " + why); process.exit(1); };
setTimeout(() => fail("timed out"), 20000);
const queue = [];
const next = () => new Promise((resolve) => queue.push(resolve));
ws.onmessage = (e) => { const r = queue.shift(); if (r) r(e.data); else fail("unexpected message"); };
ws.onerror = (e) => fail("error " + e.message);
ws.onopen = async () => {
  console.log("ok open, extensions: " + (ws.extensions || "none"));
  let got = next(); ws.send("héllo"); if ((await got) !== "héllo") fail("text");
  console.log("ok text");
  got = next(); ws.send(new Uint8Array([0, 1, 2, 255])); 
  const b = new Uint8Array(await got);
  if (b.length !== 4 || b[3] !== 255) fail("binary");
  console.log("ok binary");
  const big = "x".repeat(1 << 20);
  got = next(); ws.send(big); if ((await got) !== big) fail("1 MiB text");
  console.log("ok 1 MiB");
  const many = [];
  for (let i = 0; i < 1000; i++) { many.push(next()); ws.send("m" + i); }
  const all = await Promise.all(many);
  for (let i = 0; i < 1000; i++) if (all[i] !== "m" + i) fail("order at " + i);
  console.log("ok 1000 in flight, in order");
  ws.onclose = (e) => {
    if (e.code !== 1000 || !e.wasClean) fail("close " + e.code + " clean " + e.wasClean);
    console.log("ok close 1000, clean");
    console.log("ALL OK");
    process.exit(0);
  };
  ws.close(1000, "done");
};

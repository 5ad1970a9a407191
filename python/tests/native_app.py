"""The app the native API tests run in a subprocess: `python native_app.py PORT WORKERS`."""

import asyncio
import contextvars
import os
import sys

import canter

from firehose import PRODUCED, pieces

app = canter.App()
calls = {"n": 0}
event = None
HERE = os.path.dirname(os.path.abspath(__file__))
READY = canter.Response("prebuilt\n", headers={"x-prebuilt": "yes"})


@app.get("/")
def plaintext(req):
    calls["n"] += 1
    return "Hello, World!"


@app.get("/json")
def json_dict(req):
    return {"message": "Hello, World!", "n": 1, "pi": 3.5, "ok": True, "none": None, "l": [1, "a"]}


@app.get("/hello/{name}")
def hello(req, name):
    return f"Hello, {name}!"


@app.get("/pair/{a}/{b}")
def pair(req, b, a):
    return {"a": a, "b": b, "params": req.params}


@app.get("/files/{*rest}")
def files(req, rest):
    return rest


@app.get("/calls")
def count(req):
    return {"calls": calls["n"], "pid": os.getpid()}


@app.post("/items")
async def create(req):
    calls["n"] += 1
    item = req.json()
    return canter.Response(json=item, status=201, headers={"x-id": "1"})


@app.post("/echo")
def echo(req):
    calls["n"] += 1
    return canter.Response(req.body, headers={"x-len": str(len(req.body))})


@app.get("/inspect")
def inspect(req):
    return {
        "method": req.method,
        "path": req.path,
        "raw_path": req.raw_path.decode(),
        "query_string": req.query_string,
        "query": req.query,
        "x_token": req.headers.get("X-TOKEN"),
        "has_accept": "accept" in req.headers,
        "many": req.headers.getall("x-many"),
        "client_host": req.client[0],
        "version": req.http_version,
    }


#: Echo handlers running now (`/ws/live`): a client that leaves must end its handler.
WS_LIVE = [0]


@app.get("/ws/live")
async def ws_live(req):
    return {"live": WS_LIVE[0]}


@app.websocket("/ws/echo")
async def ws_echo(ws):
    WS_LIVE[0] += 1
    try:
        async for message in ws:
            await ws.send(message)
        print("native ws closed", ws.close_code, flush=True)
    finally:
        WS_LIVE[0] -= 1


@app.websocket("/ws/room/{name}", subprotocols=["chat.v2"])
async def ws_room(ws, name):
    await ws.send(f"welcome to {name} ({ws.subprotocol})")
    message = await ws.recv()
    if message == "boom":
        raise RuntimeError("boom from a WebSocket handler")
    await ws.close(4002, "enough")


@app.get("/sleep")
async def sleep(req):
    await asyncio.sleep(float(req.query.get("s", "0.05")))
    return {"slept": True}


@app.get("/wait")
async def wait(req):
    global event
    event = event or asyncio.Event()
    await event.wait()
    return "released"


@app.get("/release")
def release(req):
    global event
    event = event or asyncio.Event()
    event.set()
    return "ok"


CANCELLED = {"n": 0}


@app.get("/forever")
async def forever(req):
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        CANCELLED["n"] += 1
        raise
    return "never"


@app.get("/cancelled")
def cancelled(req):
    return CANCELLED


@app.get("/boom")
def boom(req):
    raise RuntimeError("boom from a handler")


@app.get("/aboom")
async def aboom(req):
    await asyncio.sleep(0)
    raise ValueError("boom from an async handler")


@app.get("/teapot")
def teapot(req):
    raise canter.HTTPError(418, "short and stout")


@app.get("/none")
def nothing(req):
    return None


@app.get("/bytes")
def raw(req):
    return b"\x00\x01binary"


@app.get("/prebuilt")
def prebuilt(req):
    return READY


@app.get("/bad-return")
def bad_return(req):
    return 42


@app.get("/stream")
def stream(req):
    def gen():
        for i in range(int(req.query.get("n", "3"))):
            yield f"piece {i}\n"
    return canter.Response(stream=gen(), content_type="text/plain")


@app.get("/firehose")
def firehose(req):
    return canter.Response(stream=pieces())


@app.get("/produced")
def produced(req):
    return PRODUCED


@app.get("/astream")
def astream(req):
    async def gen():
        for i in range(3):
            await asyncio.sleep(0.01)
            yield f"apiece {i}\n".encode()
    return canter.Response(stream=gen())


@app.get("/file")
def file(req):
    return canter.Response(file=os.path.join(HERE, "static", "hello.txt"))


@app.route("/multi", methods=("GET", "PUT"))
def multi(req):
    return req.method


@app.get("/big-headers")
def big_headers(req):
    n = int(req.query.get("n", "60000"))
    headers = [(f"x-h{i}", "v" * 100) for i in range(90)] + [("x-big", "b" * n)]
    return canter.Response("ok", headers=headers)


SOON_VAR = contextvars.ContextVar("soon", default="unset")


def _soon_boom():
    raise RuntimeError("soon-boom")


@app.get("/soon")
async def soon(req):
    # loop.call_soon while the engine drives the loop (its Rust call_soon): order, cancel,
    # the caller's context, and an exception reported to the loop's handler.
    loop = asyncio.get_running_loop()
    ran = []
    SOON_VAR.set("caller")
    first = loop.call_soon(ran.append, "first")
    dropped = loop.call_soon(ran.append, "cancelled")
    dropped.cancel()
    loop.call_soon(lambda: ran.append(SOON_VAR.get()))
    loop.call_soon(_soon_boom)
    loop.call_soon(ran.append, "after-boom")
    for _ in range(3):
        await asyncio.sleep(0)
    return {"ran": ran, "cancelled": dropped.cancelled(), "first_cancelled": first.cancelled(),
            "handle": type(first).__module__ + "." + type(first).__name__}


@app.get("/die")
def die(req):
    os._exit(3)


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), workers=int(sys.argv[2]), body_limit=64 * 1024)

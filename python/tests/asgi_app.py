"""A Starlette app and a FastAPI app for the ASGI tests (`python -m canter serve asgi_app:app`)."""

import asyncio
import contextlib
import os
from typing import List, Optional

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from firehose import PRODUCED, pieces

EVENTS = []


@contextlib.asynccontextmanager
async def lifespan(app):
    EVENTS.append("startup")
    print("lifespan startup pid", os.getpid(), flush=True)
    yield {"greeting": "hello from lifespan"}
    print("lifespan shutdown pid", os.getpid(), flush=True)


async def plaintext(request):
    return PlainTextResponse("Hello, World!")


async def json_endpoint(request):
    return JSONResponse({"message": "Hello, World!"})


async def echo(request):
    body = await request.body()
    return PlainTextResponse(body.decode(), headers={"x-len": str(len(body))})


async def stream_upload(request):
    n = 0
    chunks = 0
    async for chunk in request.stream():
        n += len(chunk)
        chunks += 1
    return JSONResponse({"bytes": n, "chunks": chunks})


async def state(request):
    return PlainTextResponse(request.state.greeting)


async def scope_view(request):
    s = request.scope
    return JSONResponse({
        "path": s["path"], "raw_path": s["raw_path"].decode(), "query_string": s["query_string"].decode(),
        "method": s["method"], "http_version": s["http_version"], "scheme": s["scheme"],
        "root_path": s["root_path"], "client": list(s["client"]), "server": list(s["server"]),
        "headers": [[k.decode(), v.decode()] for k, v in s["headers"]],
        "asgi": s["asgi"],
    })


async def stream(request):
    n = int(request.query_params.get("n", "5"))

    async def gen():
        for i in range(n):
            yield f"line {i}\n"
            if i % 1000 == 0:
                await asyncio.sleep(0)

    return StreamingResponse(gen(), media_type="text/plain")


async def boom(request):
    raise RuntimeError("boom in a Starlette endpoint")


def sync_endpoint(request):
    # Starlette runs sync endpoints in a thread pool (anyio): the worker's loop must serve it.
    return PlainTextResponse("from a thread")


DISCONNECTS = []


async def watch_disconnect(request):
    async def gen():
        for i in range(1000):
            if await request.is_disconnected():
                DISCONNECTS.append(i)
                print("client disconnected at", i, flush=True)
                return
            yield b"x" * 1024
            await asyncio.sleep(0.01)

    return StreamingResponse(gen())


async def firehose(request):
    """firehose.pieces() from an async generator (closing it closes them)."""

    async def gen():
        for piece in pieces():
            yield piece

    return StreamingResponse(gen())


async def produced(request):
    return JSONResponse(PRODUCED)


def after():
    print("background task ran", flush=True)


async def background(request):
    return PlainTextResponse("queued", background=BackgroundTask(after))


#: Echo handlers running now (`/ws/live`): a client that leaves must end its handler.
WS_LIVE = [0]


async def ws_live(request):
    return JSONResponse({"live": WS_LIVE[0]})


async def ws_echo(websocket):
    """Echoes text and bytes until the client closes; logs the close code it was told."""
    await websocket.accept()
    WS_LIVE[0] += 1
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                print("ws disconnect", message["code"], flush=True)
                return
            if message.get("text") is not None:
                await websocket.send_text(message["text"])
            else:
                await websocket.send_bytes(message["bytes"])
    finally:
        WS_LIVE[0] -= 1
        print("ws echo done", flush=True)


async def ws_refuse(websocket):
    await websocket.close(code=1008)


async def ws_boom(websocket):
    """Fails after accepting: the client gets 1011."""
    await websocket.accept()
    await websocket.receive_text()
    raise RuntimeError("ws boom after accept")


async def ws_deny(websocket):
    """Denies the upgrade with a response of its own (the websocket.http.response extension)."""
    await websocket.send_denial_response(
        PlainTextResponse("no entry without a token", status_code=401,
                          headers={"www-authenticate": "Bearer", "x-why": "token"}))


app = Starlette(
    routes=[
        WebSocketRoute("/ws", ws_echo),
        WebSocketRoute("/ws/refuse", ws_refuse),
        WebSocketRoute("/ws/boom", ws_boom),
        WebSocketRoute("/ws/deny", ws_deny),
        Route("/ws/live", ws_live),
        Route("/", plaintext),
        Route("/json", json_endpoint),
        Route("/echo", echo, methods=["POST"]),
        Route("/upload", stream_upload, methods=["POST"]),
        Route("/state", state),
        Route("/scope/{rest:path}", scope_view),
        Route("/stream", stream),
        Route("/boom", boom),
        Route("/sync", sync_endpoint),
        Route("/watch", watch_disconnect),
        Route("/background", background),
        Route("/firehose", firehose),
        Route("/produced", produced),
    ],
    lifespan=lifespan,
)


api = FastAPI()


class Item(BaseModel):
    name: str
    price: float
    tags: List[str] = []


@api.post("/items", status_code=201)
async def create_item(item: Item):
    return {"name": item.name, "price": item.price, "tags": item.tags}


@api.get("/items/{item_id}")
def read_item(item_id: int, q: Optional[str] = None):
    if item_id == 404:
        raise HTTPException(status_code=404, detail="no such item")
    return {"item_id": item_id, "q": q}


@api.get("/plaintext")
async def api_plaintext():
    return PlainTextResponse("Hello, World!")


@api.websocket("/ws/{room}")
async def chat(websocket: WebSocket, room: str):
    """Chooses the `chat.v2` subprotocol when offered, greets, echoes JSON with the room, and
    closes with 4001 when told "bye"."""
    subprotocol = "chat.v2" if "chat.v2" in websocket.scope["subprotocols"] else None
    await websocket.accept(subprotocol=subprotocol)
    await websocket.send_json({"room": room, "scope": websocket.scope["type"],
                               "scheme": websocket.scope["scheme"]})
    try:
        while True:
            data = await websocket.receive_json()
            if data.get("say") == "bye":
                await websocket.close(code=4001, reason="bye to you too")
                return
            await websocket.send_json({"room": room, "echo": data})
    except WebSocketDisconnect as e:
        print("chat disconnect", e.code, flush=True)

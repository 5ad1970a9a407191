"""The same Starlette app for every ASGI server: plaintext and a JSON dict."""
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


async def plaintext(request):
    return PlainTextResponse("Hello, World!")


async def json_endpoint(request):
    return JSONResponse({"message": "Hello, World!"})


app = Starlette(routes=[Route("/plaintext", plaintext), Route("/json", json_endpoint)])

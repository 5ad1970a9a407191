"""Japronto: plaintext and a JSON dict, the handlers of canter_native.py.
`python japronto_app.py PORT` (one worker)."""
import sys

from japronto import Application


def plaintext(request):
    return request.Response(text="Hello, World!")


def json(request):
    return request.Response(json={"message": "Hello, World!"})


app = Application()
app.router.add_route("/plaintext", plaintext)
app.router.add_route("/json", json)

if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), worker_num=1)

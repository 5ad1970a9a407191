"""Robyn: plaintext and a JSON dict. PORT from the environment (Robyn parses argv itself)."""
import os

from robyn import Robyn

app = Robyn(__file__)


@app.get("/plaintext")
def plaintext():
    return "Hello, World!"


@app.get("/json")
def json():
    return {"message": "Hello, World!"}


if __name__ == "__main__":
    app.start(host="127.0.0.1", port=int(os.environ["PORT"]))

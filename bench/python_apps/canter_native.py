"""canter's native API: plaintext and a JSON dict. `python canter_native.py PORT`."""
import sys

import canter

app = canter.App()


@app.get("/plaintext")
def plaintext(req):
    return "Hello, World!"


@app.get("/json")
def json(req):
    return {"message": "Hello, World!"}


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), workers=1)

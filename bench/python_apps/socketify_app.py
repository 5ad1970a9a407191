"""socketify's native API: plaintext and a JSON dict. `python socketify_app.py PORT`."""
import sys

from socketify import App

app = App()
app.get("/plaintext", lambda res, req: res.end("Hello, World!"))
app.get("/json", lambda res, req: res.send({"message": "Hello, World!"}))
app.listen(int(sys.argv[1]), lambda config: print("listening", flush=True))
app.run()

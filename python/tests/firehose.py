"""The endless response both test apps stream to a client that stops reading: 1 KiB pieces, up
to 100 MB, counted as the app hands them to the server, `done` once the generator is closed."""

PRODUCED = {"n": 0, "done": False}


def pieces():
    PRODUCED["n"] = 0
    PRODUCED["done"] = False
    try:
        for _ in range(100_000):
            PRODUCED["n"] += 1
            yield b"f" * 1024
    finally:
        PRODUCED["done"] = True

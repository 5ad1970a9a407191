"""`python -m canter serve module:app`: see canter.asgi."""

from .asgi import main

main()

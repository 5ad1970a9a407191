"""`python -m canter serve module:app` (see canter.asgi) and `python -m canter pipeline
module:flow` (see canter.pipeline)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "pipeline":
    from .pipeline import main as pipeline_main

    sys.exit(pipeline_main(sys.argv[2:]))

from .asgi import main

main()

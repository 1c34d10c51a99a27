"""The process the Lambda Web Adapter talks to: the front door's web app on 127.0.0.1:8080.

Started by ``run.sh`` (the function's handler, executed by the adapter's ``/opt/bootstrap``); see
``handler.py`` for why. The app itself (routes, streaming, ``TCP_NODELAY``) is
:mod:`prefix_routing.frontdoor.webapp`; this module only builds the invoker during the init phase and
serves.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import handler as lambda_handler  # noqa: E402
from prefix_routing.frontdoor.webapp import MAX_READ_BYTES, FrontDoorHandler, FrontDoorServer  # noqa: E402, F401
from prefix_routing.frontdoor.webapp import make_server as _make_server  # noqa: E402


def make_server(host: str = "127.0.0.1", port: int = 8080, get_invoker=None) -> FrontDoorServer:
    """The web app bound to ``host:port`` (``port=0``: a free one); ``get_invoker`` for tests."""
    return _make_server(host, port, get_invoker or lambda_handler.get_invoker,
                        on_failure=lambda_handler._configuration_failure)


def main() -> None:
    try:
        lambda_handler.get_invoker()  # cold start work now, in the init phase
    except Exception as error:  # noqa: BLE001 - every request will answer 500 and retry the setup
        lambda_handler._configuration_failure(error)
    port = int(os.environ.get("AWS_LWA_PORT") or os.environ.get("PORT") or 8080)
    server = make_server("127.0.0.1", port)
    print(json.dumps({"message": "prefix_routing.listening", "port": port}), flush=True)
    server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()

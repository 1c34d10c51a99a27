"""A DynamoDB-compatible server on 127.0.0.1 for the front door's limits: dynalite, in memory.

``dynalite`` (npm, pinned in package.json; ``make install`` installs it with ``npm ci``) implements
DynamoDB's wire protocol and evaluates condition expressions as DynamoDB does, which is what the
limits depend on (one atomic conditional write per admission). It is started here on a free port
of 127.0.0.1 and stopped by its own process id::

    with LocalDynamo() as store:
        boto3.client("dynamodb", endpoint_url=store.url, region_name="us-east-1", ...)

Its data lives in memory and ends with the process. Standard library only (plus Node.js).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from prefix_routing.rules.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DYNALITE = ROOT / "node_modules" / "dynalite"
# Tables are ACTIVE at once (dynalite's default keeps them CREATING for 500 ms); port 0: a free one.
_SCRIPT = """
const dynalite = require(process.argv[1]);
const server = dynalite({createTableMs: 0, deleteTableMs: 0, updateTableMs: 0});
server.listen(0, "127.0.0.1", () => console.log(JSON.stringify({port: server.address().port})));
"""


class LocalDynamo:
    """dynalite on 127.0.0.1 (``url``, ``pid``); :meth:`stop` ends exactly that process."""

    def __init__(self, *, start_timeout_s: float = 15.0) -> None:
        node = shutil.which("node")
        if node is None or not (DYNALITE / "package.json").is_file():
            raise UserError(f"{DYNALITE} (or node) is missing: run `make install` (npm ci installs dynalite, the "
                            "local DynamoDB-compatible store of the front door's limits)")
        self.process = subprocess.Popen([node, "-e", _SCRIPT, str(DYNALITE)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                        start_new_session=True)
        self.pid = self.process.pid
        self.port = self._read_port(start_timeout_s)
        # Drain its output so that a chatty process never blocks on a full pipe.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()
        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def _read_port(self, timeout_s: float) -> int:
        found: list[int] = []
        reader = threading.Thread(target=lambda: found.append(json.loads(self.process.stdout.readline())["port"]),
                                  daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self.stop()
            raise UserError(f"dynalite did not start within {timeout_s:g} s")
        return int(found[0])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """End the process this object started (by its pid), then wait for it."""
        if self.process.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(5)
            except ProcessLookupError:
                pass

    def __enter__(self) -> LocalDynamo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


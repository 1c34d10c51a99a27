"""A stand-in for llama-server: a script that serves /health, /slots and /metrics on --port; with
--worker it first starts a worker that ignores SIGTERM and outlives it, as a stuck engine worker would."""

import os
import stat
import sys

import pytest

FAKE_SERVER = '''#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
if "--fail" in sys.argv:
    sys.exit(3)
if "--worker" in sys.argv:
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = {{"/health": b'{{"status":"ok"}}', "/slots": json.dumps([{{"id": 0, "is_processing": False, "n_ctx": 8192}}]).encode(),
                "/metrics": b"llamacpp:prompt_tokens_cached_total 42\\n"}}.get(self.path)
        self.send_response(200 if body else 404); self.end_headers(); self.wfile.write(body or b"")
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_server(tmp_path):
    path = tmp_path / "llama-server"
    path.write_text(FAKE_SERVER.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path

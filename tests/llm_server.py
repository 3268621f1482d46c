"""A real OpenAI-compatible chat-completions server on 127.0.0.1, replaying a script.

Each request to ``POST /v1/chat/completions`` takes the next step of the script:

* a string: a reply with that content (``finish_reason`` ``stop``);
* ``{"content": ..., "finish": "length"}``: a reply that ended as said;
* ``{"status": 500}`` / ``{"status": 429, "retry_after_ms": 5}``: an HTTP error (an
  OpenAI-style error body, and a ``retry-after-ms`` header when given);
* ``{"sleep": S, ...}``: wait ``S`` seconds first (a timeout), then do the rest.

A request for a model the server does not serve is a 404 ``model_not_found`` and takes
no step. Every request body is kept (``requests``), so a test can read the conversation.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedLLM:
    def __init__(self, script, models=("test-model",)):
        self.script = list(script)
        self.models = set(models)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):          # quiet
                pass

            def _send(self, status: int, body: dict, headers: dict | None = None):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if body.get("model") not in outer.models:
                    return self._send(404, {"error": {
                        "message": f"model '{body.get('model')}' not found",
                        "type": "invalid_request_error", "code": "model_not_found"}})
                with outer.lock:
                    outer.requests.append(body)
                    step = outer.script.pop(0) if outer.script else {"status": 500,
                                                                     "message": "script done"}
                if isinstance(step, str):
                    step = {"content": step}
                if step.get("sleep"):
                    time.sleep(step["sleep"])
                if "status" in step:
                    headers = {}
                    if "retry_after_ms" in step:
                        headers["retry-after-ms"] = str(step["retry_after_ms"])
                    return self._send(step["status"], {"error": {
                        "message": step.get("message", f"scripted HTTP {step['status']}"),
                        "type": "server_error"}}, headers)
                return self._send(200, {
                    "id": f"chatcmpl-{len(outer.requests)}", "object": "chat.completion",
                    "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": step.get("finish", "stop"),
                                 "message": {"role": "assistant",
                                             "content": step["content"]}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False

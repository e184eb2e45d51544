#!/usr/bin/env python3
"""A minimal OpenAI-compatible server for load-generator tests: /v1/models and streamed
/v1/completions that answer at once with GEN_TOKENS pieces of text, like a server that reports
neither cached_tokens nor token ids (llama-server, say). Each completion request's headers and
prompt are appended to LOG as one JSON line, so a test can check what the client sent.

  usage: openai_stub.py PORT_FILE LOG
Listens on a free loopback port and writes it to PORT_FILE once it accepts connections.
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

PORT_FILE, LOG = sys.argv[1], sys.argv[2]
lock = Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet: the test reads LOG, not stderr
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            # No "meta": the client then draws token ids below 500, as for an unknown server.
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}))
        else:
            self.reply(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with lock, open(LOG, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                                "prompt": body.get("prompt"), "max_tokens": body.get("max_tokens")}) + "\n")
        n = int(body.get("max_tokens", 1))
        prompt = body.get("prompt")
        events = [{"choices": [{"index": 0, "text": " w", "finish_reason": None}]} for _ in range(n)]
        events.append({"choices": [], "usage": {
            "prompt_tokens": len(prompt) if isinstance(prompt, list) else 1,
            "completion_tokens": n, "total_tokens": n}})
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self.reply(200, sse, "text/event-stream")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(PORT_FILE + ".tmp", PORT_FILE)  # whole or absent: the test polls for it
server.serve_forever()

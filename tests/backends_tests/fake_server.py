"""A stand-in server process with scripted faults, for lifecycle tests (stdlib only).

    python fake_server.py --port P --mode MODE [--after S] [--child] [--ignore-term]

modes: ok, exit_at_start, oom, slow_start (never binds), port_taken (binds --bind-port, which the
test holds), crash_after (dies S s after serving starts), hang_after (S s after start every
request, /health included, blocks forever while the process lives).
Endpoints: /health, /ready, /server_info, /v1/completions (non-streaming JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"start": time.monotonic(), "hang_after": None}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # keep logs small
        pass

    def _maybe_hang(self):
        if STATE["hang_after"] is not None and time.monotonic() - STATE["start"] > STATE["hang_after"]:
            time.sleep(3600)

    def _json(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._maybe_hang()
        if self.path in ("/health", "/ready"):
            self._json({"ok": True})
        elif self.path == "/server_info":
            self._json({"max_total_num_tokens": 1000, "attn_dp_size": 2, "dp_size": 1, "version": "fake"})
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self):
        self._maybe_hang()
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self._json({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--after", type=float, default=1.0)
    ap.add_argument("--bind-port", type=int)
    ap.add_argument("--child", action="store_true", help="start a child process that sleeps")
    ap.add_argument("--ignore-term", action="store_true")
    args = ap.parse_args()
    print(f"fake server pid={os.getpid()} mode={args.mode}", flush=True)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child:
        code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)" \
            if args.ignore_term else "import time; time.sleep(3600)"
        child = subprocess.Popen([sys.executable, "-c", code])
        print(f"child pid={child.pid}", flush=True)
    if args.mode == "exit_at_start":
        print("ValueError: invalid value for --tp-size", flush=True)
        sys.exit(1)
    if args.mode == "oom":
        time.sleep(0.2)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if args.mode == "slow_start":
        time.sleep(3600)
    port = args.bind_port if args.mode == "port_taken" else args.port
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # raises EADDRINUSE for port_taken
    server.daemon_threads = True
    STATE["start"] = time.monotonic()
    if args.mode == "hang_after":
        STATE["hang_after"] = args.after
    if args.mode == "crash_after":
        def crash():
            time.sleep(args.after)
            print("RuntimeError: NCCL error: unhandled system error", flush=True)
            os._exit(134)
        threading.Thread(target=crash, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()

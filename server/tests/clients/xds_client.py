"""gRPC's own proxyless xDS client (grpcio) calling a test gRPC server under Levee's policy.

Used by server/tests/e2e/xds.rs; runs in the venv .ci/run makes under target/xds-venv.
It starts the test server (a unary method /levee.test.Echo/Call on 127.0.0.1, any free
port) and prints {"ready": true, "port": N}. Then each line on stdin is one JSON command,
answered by one JSON line:

* {"cmd": "connect", "target": "xds:///pricing"}: the channel, through the xDS bootstrap
  named by GRPC_XDS_BOOTSTRAP (read by gRPC when the first xDS channel is made);
* {"cmd": "backend", "delay_ms": D, "fail_next": N}: the test server waits D ms in each
  call and fails the next N calls with UNAVAILABLE; its count of calls starts again;
* {"cmd": "call", "timeout_s": T}: one call with the caller's deadline T (default 30 s),
  answered {"code", "details", "ms", "attempts"} (attempts: calls the server saw);
* {"cmd": "calls", "n": N}: N calls at once, answered {"codes": [...], "attempts"}.
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/levee.test.Echo/Call"


class Backend:
    def __init__(self):
        self.lock = threading.Lock()
        self.delay = 0.0
        self.fail_next = 0
        self.attempts = 0

    def call(self, request, context):
        with self.lock:
            self.attempts += 1
            fail = self.fail_next > 0
            if fail:
                self.fail_next -= 1
            delay = self.delay
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the test server was told to fail")
        if delay:
            time.sleep(delay)
        return request


def main() -> None:
    backend = Backend()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    handler = grpc.unary_unary_rpc_method_handler(backend.call)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("levee.test.Echo", {"Call": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"ready": True, "port": port}), flush=True)
    channel = None
    call = None
    pool = futures.ThreadPoolExecutor(max_workers=32)
    for line in sys.stdin:
        cmd = json.loads(line)
        kind = cmd["cmd"]
        if kind == "connect":
            channel = grpc.insecure_channel(cmd["target"])
            call = channel.unary_unary(METHOD)
            out = {"ok": True}
        elif kind == "backend":
            with backend.lock:
                backend.delay = cmd.get("delay_ms", 0) / 1000.0
                backend.fail_next = cmd.get("fail_next", 0)
                backend.attempts = 0
            out = {"ok": True}
        elif kind == "call":
            out = one_call(call, cmd.get("timeout_s", 30.0))
            with backend.lock:
                out["attempts"] = backend.attempts
                backend.attempts = 0
        elif kind == "calls":
            n = cmd["n"]
            results = list(pool.map(lambda _: one_call(call, 30.0), range(n)))
            with backend.lock:
                out = {"codes": sorted(r["code"] for r in results), "attempts": backend.attempts}
                backend.attempts = 0
        else:
            out = {"error": f"unknown command {kind}"}
        print(json.dumps(out), flush=True)
    server.stop(0)


def one_call(call, timeout_s: float) -> dict:
    start = time.monotonic()
    try:
        call(b"ping", timeout=timeout_s, wait_for_ready=True)
        code, details = "OK", ""
    except grpc.RpcError as e:
        code, details = e.code().name, e.details() or ""
    return {"code": code, "details": details, "ms": int((time.monotonic() - start) * 1000)}


if __name__ == "__main__":
    main()

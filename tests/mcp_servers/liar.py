"""An MCP server that misbehaves, for the tests: it speaks JSON-RPC over
stdio by hand (the SDK's servers would not send what this one sends) and
answers as its first argument says.

- ``list``: answers the handshake (the older protocol: ``server/discover``
  is refused, ``initialize`` answered) and ``tools/list`` with the text of
  the file ``LIAR_TOOLS`` as it is — the tools array, written as the test
  wants it (``NaN`` in a schema, a name twice).
- ``hang``: reads every request and answers none (a server stuck starting).

A ``tools/call`` is logged to ``LIAR_LOG`` (one line per call), so a test
counts the calls that reached it, and answered ``{"content": [{"type":
"text", "text": "done"}]}`` — or, for a tool whose name starts with
``refuse``, with a JSON-RPC error in place of a result; for one named
``huge_<size>``, with a text of ``size`` bytes, written a piece at a time
(the server never holds it whole either); for one named ``slow_*``, after
2 s, while the server goes on reading and answering other requests.

Run as ``python -m tests.mcp_servers.liar list`` (or ``hang``).
"""

import json
import os
import sys
import threading
import time

HANDSHAKE_VERSION = "2025-06-18"


#: One message at a time on stdout: a slow call is answered from a thread.
_writing = threading.Lock()


def _answer(request_id, result_text: str) -> None:
    with _writing:
        sys.stdout.write(
            f'{{"jsonrpc": "2.0", "id": {json.dumps(request_id)}, "result": {result_text}}}\n'
        )
        sys.stdout.flush()


def _refuse(request_id, code: int, message: str) -> None:
    error = {"code": code, "message": message}
    with _writing:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
        sys.stdout.flush()


def _answer_slowly(request_id) -> None:
    time.sleep(2)
    _answer(request_id, '{"content": [{"type": "text", "text": "done slowly"}]}')


def _answer_huge(request_id, size: int) -> None:
    sys.stdout.write(
        f'{{"jsonrpc": "2.0", "id": {json.dumps(request_id)}, '
        '"result": {"content": [{"type": "text", "text": "'
    )
    piece = "x" * 65536
    for _ in range(size // len(piece) + 1):
        sys.stdout.write(piece)
    sys.stdout.write('"}]}}\n')
    sys.stdout.flush()


def _serve_one(message: dict) -> None:
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        return  # a notification
    if method == "server/discover":
        _refuse(request_id, -32601, "method not found")
    elif method == "initialize":
        _answer(
            request_id,
            json.dumps(
                {
                    "protocolVersion": HANDSHAKE_VERSION,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "liar", "version": "1"},
                }
            ),
        )
    elif method == "ping":
        _answer(request_id, "{}")
    elif method == "tools/list":
        with open(os.environ["LIAR_TOOLS"]) as tools:
            _answer(request_id, f'{{"tools": {tools.read()}}}')
    elif method == "tools/call":
        name = message["params"].get("name")
        with open(os.environ["LIAR_LOG"], "a") as log:
            log.write(json.dumps(name) + "\n")
        if name.startswith("refuse"):
            _refuse(request_id, -32602, f"cannot do {name} now")
        elif name.startswith("slow"):
            threading.Thread(target=_answer_slowly, args=(request_id,)).start()
        elif name.startswith("huge"):
            _answer_huge(request_id, int(name.removeprefix("huge_")))
        else:
            _answer(request_id, '{"content": [{"type": "text", "text": "done"}]}')
    else:
        _refuse(request_id, -32601, "method not found")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "list"
    for line in sys.stdin:
        if mode == "hang" or not line.strip():
            continue
        _serve_one(json.loads(line))


if __name__ == "__main__":
    main()

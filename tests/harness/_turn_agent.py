"""A small agent harness for the turn-layer tests: a real program speaking the JSON-lines turn
protocol of ``JsonLinesHarnessAdapter``, and a real MCP client (streamable HTTP, standard library
only, so it runs in the harness sandbox on the bare interpreter).

Instead of a model it follows commands, one per turn:
  call <tool> <json arguments>   call an MCP tool through the bridge (tool_call, tool_result events)
  tools                          list the bridge's tools
  sleep <seconds>                take that long
  die                            exit in the middle of the turn
  done <text>                    answer and say the episode is over
  anything else                  echoed back
"""

import http.client
import json
import os
import socket
import sys
import time
from urllib.parse import unquote, urlsplit


def emit(kind, **data):
    print(json.dumps({"type": kind, "timestamp": time.time(), "data": data}), flush=True)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.socket_path)


class MCPClient:
    """JSON-RPC over MCP's streamable HTTP: initialize once, then requests with the session id."""

    def __init__(self, url):
        parts = urlsplit(url)
        if parts.scheme == "http+unix":
            self.connect = lambda: UnixHTTPConnection(unquote(parts.netloc))
        else:
            self.connect = lambda: http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.path = parts.path or "/"
        self.session = None
        self.next_id = 0

    def _post(self, payload):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers["mcp-session-id"] = self.session
            headers["mcp-protocol-version"] = "2025-06-18"
        connection = self.connect()
        try:
            connection.request("POST", self.path, json.dumps(payload), headers)
            response = connection.getresponse()
            body = response.read().decode()
            self.session = response.getheader("mcp-session-id") or self.session
        finally:
            connection.close()
        if response.status >= 400:
            raise RuntimeError(f"MCP HTTP {response.status}: {body[:200]}")
        if "id" not in payload:
            return None
        if response.getheader("content-type", "").startswith("text/event-stream"):
            for line in body.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if message.get("id") == payload["id"]:
                        return message
            raise RuntimeError("no answer in the event stream")
        return json.loads(body)

    def request(self, method, params):
        if self.session is None and method != "initialize":
            self.request(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "turn-agent", "version": "1"},
                },
            )
            self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.next_id += 1
        answer = self._post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if "error" in answer:
            raise RuntimeError(answer["error"].get("message"))
        return answer["result"]


def turn(client, text):
    command, _, rest = text.strip().partition(" ")
    if command == "call":
        name, _, arguments = rest.partition(" ")
        arguments = json.loads(arguments or "{}")
        emit("tool_call", tool_name=name, arguments=arguments)
        result = client.request("tools/call", {"name": name, "arguments": arguments})
        value = result.get("structuredContent", {}).get("result")
        if value is None:
            value = " ".join(c.get("text", "") for c in result.get("content", []))
        emit("tool_result", tool_name=name, result=value, is_error=bool(result.get("isError")))
        emit("turn_complete", response=json.dumps(value))
    elif command == "tools":
        names = sorted(t["name"] for t in client.request("tools/list", {})["tools"])
        emit("turn_complete", response=" ".join(names))
    elif command == "sleep":
        time.sleep(float(rest))
        emit("turn_complete", response="slept")
    elif command == "die":
        emit("text_output", text="dying")
        sys.stderr.write("agent: told to die\n")
        sys.exit(3)
    elif command == "done":
        emit("turn_complete", response=rest, done=True)
    else:
        print("plain text, not an event", flush=True)
        emit("turn_complete", response=f"echo: {text}")


def main():
    url = os.environ.get("OPENENV_MCP_URL")
    client = MCPClient(url) if url else None
    offered = [tool["name"] for tool in json.loads(os.environ.get("OPENENV_TOOLS", "[]"))]
    print(json.dumps({"type": "ready", "tools": offered}), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        try:
            turn(client, message["content"])
        except Exception as exc:  # a failed tool call is the turn's answer, not the agent's end
            emit("error", message=f"{type(exc).__name__}: {exc}", recoverable=True)
            emit("turn_complete", response=f"failed: {exc}")


if __name__ == "__main__":
    main()

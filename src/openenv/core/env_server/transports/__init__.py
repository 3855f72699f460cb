"""The transports: codecs around the one dispatch (:mod:`..dispatch`). Each decodes what arrived
into a call, hands it to the dispatcher and encodes the answer, or renders the error raised.

* :mod:`.ws` — the WebSocket routes, ``/ws`` (the session protocol) and ``WS /mcp``: one
  connection class for both (the handshake, resume, noticing a client that leaves, the close);
* :mod:`.mcp` — MCP's JSON-RPC, for ``POST``/``DELETE /mcp`` and for the JSON-RPC messages the
  WebSocket routes hand it.

The HTTP routes (``/reset``, ``/step``, ``/state``, the Task API) are :mod:`..http_server`'s (an
upstream module path), and the web playground's are :mod:`..web`'s.
"""

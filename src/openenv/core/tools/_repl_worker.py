"""The REPL worker: a long-lived Python process inside a sandbox (standard library only).

Run as ``python _repl_worker.py REQUEST_FD REPLY_FD``. It answers ``{"ready": true}`` once, then
for every request line ``{"code": ...}`` runs the code in one persistent ``__main__`` namespace
and answers ``{"exit_code": N}`` after flushing stdout and stderr (so everything the cell printed
is in the output pipes before its reply is). Cells behave like the interactive interpreter: the
value of a final expression statement is echoed through :func:`sys.displayhook` (its ``repr``,
unless ``None``); an exception prints its traceback to stderr and gives exit code 1;
``SystemExit`` gives its code and does not end the worker.

A request ``{"code": ..., "tools": [names]}`` is a code-mode run instead (see :mod:`.code_mode`):
the code runs with fresh locals and, as globals, one stub per tool. Calling a stub sends
``{"call": name, "args": [...], "kwargs": {...}}`` and waits for ``{"return": value}`` or
``{"raise": type name, "message": text}``. The answer is ``{"exit_code": 0, "result": ...}`` (the
code's ``result`` variable, as JSON) or ``{"exit_code": 1, "error": text}`` (the text of what it
raised; for a SyntaxError ``"Syntax error: "`` and its text, as upstream OpenEnv words it).
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import sys
import traceback
import types
from typing import Any, Dict


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _print_exception(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # hide the worker's own frames
    traceback.print_exception(type(exc), exc, tb)


def run_cell(code: str, filename: str, namespace: Dict[str, Any]) -> int:
    """Run one cell in ``namespace``; the exit code it gives (0, 1 or a ``SystemExit`` code)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            sys.displayhook(eval(compile(last, filename, "eval"), namespace))
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException as exc:
        _print_exception(exc)
        return 1


def _tool_stub(name, call):
    def stub(*args, **kwargs):
        return call(name, list(args), kwargs)

    stub.__name__ = stub.__qualname__ = name
    return stub


def _tool_error(answer):
    kind = getattr(builtins, str(answer.get("raise")), None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)) or issubclass(kind, OSError):
        kind = RuntimeError  # the environment's own exception types do not exist here
    return kind(answer.get("message", ""))


def run_with_tools(request, call):
    """The answer to a code-mode request; ``call(name, arguments)`` reaches the environment."""
    namespace = {"__builtins__": builtins}
    for name in request["tools"]:
        namespace[name] = _tool_stub(name, call)
    scope = {}
    try:
        exec(compile(request["code"], "<string>", "exec"), namespace, scope)
    except SyntaxError as exc:  # worded as upstream words it: the text alone may not say what it is
        return {"exit_code": 1, "error": f"Syntax error: {exc}"}
    except BaseException as exc:  # the agent's SystemExit is its error too
        return {"exit_code": 1, "error": str(exc)}
    try:
        result = json.loads(json.dumps(scope.get("result"), default=repr))
    except ValueError as exc:  # a circular structure, say
        return {"exit_code": 1, "error": f"result cannot be sent back: {exc}"}
    return {"exit_code": 0, "result": result}


def main() -> None:
    request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
    for fd in (request_fd, reply_fd):
        os.set_inheritable(fd, False)  # processes the cells start must not hold the protocol pipes
    requests = os.fdopen(request_fd, "rb")

    def reply(message: Dict[str, Any]) -> None:
        os.write(reply_fd, json.dumps(message).encode() + b"\n")

    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    sys.argv = [""]
    sys.path[0] = ""  # imports come from the working directory, as in the interactive interpreter
    reply({"ready": True})

    def call(name, args, kwargs):
        reply({"call": name, "args": args, "kwargs": kwargs})
        answer = json.loads(requests.readline() or "{}")
        if "return" in answer:
            return answer["return"]
        raise _tool_error(answer)

    for number, line in enumerate(iter(requests.readline, b""), start=1):
        request = json.loads(line)
        if "tools" in request:
            answer = run_with_tools(request, call)
        else:
            answer = {"exit_code": run_cell(request["code"], f"<cell {number}>", module.__dict__)}
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        reply(answer)


if __name__ == "__main__":
    main()

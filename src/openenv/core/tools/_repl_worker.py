"""The REPL worker: a long-lived Python process inside a sandbox (standard library only).

Run as ``python _repl_worker.py REQUEST_FD REPLY_FD``. It answers ``{"ready": true}`` once, then
for every request line ``{"code": ...}`` runs the code in one persistent ``__main__`` namespace
and answers ``{"exit_code": N}`` after flushing stdout and stderr (so everything the cell printed
is in the output pipes before its reply is). Cells behave like the interactive interpreter: the
value of a final expression statement is echoed through :func:`sys.displayhook` (its ``repr``,
unless ``None``); an exception prints its traceback to stderr and gives exit code 1;
``SystemExit`` gives its code and does not end the worker.
"""

from __future__ import annotations

import ast
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
    for number, line in enumerate(requests, start=1):
        code = json.loads(line)["code"]
        exit_code = run_cell(code, f"<cell {number}>", module.__dict__)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        reply({"exit_code": exit_code})


if __name__ == "__main__":
    main()

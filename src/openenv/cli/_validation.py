"""Where the checks of ``openenv validate`` lived before they became the library
:mod:`openenv.core.checks`; the command itself is :mod:`openenv.cli.commands.validate`."""

from __future__ import annotations

from openenv.core.checks.server import _auth_headers as _auth_headers  # read here by older tests and tools

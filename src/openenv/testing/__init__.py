"""Helpers for testing environments, the escape tests of sandboxed ones in particular.

An environment that runs an agent's code should show that the sandbox holds: plant what an
escape would reach on the host, run the attack through the environment, and check it failed::

    from openenv.testing import host_listener, planted_secret

    with planted_secret() as secret:                   # a file in the host's home
        result = env.step(CodeAction(code=f"print(open({str(secret)!r}).read())"))
    assert secret.text not in result.observation.stdout

    with host_listener() as listener:                  # a TCP listener on the host's 127.0.0.1
        env.step(CodeAction(code=listener.client_code()))
    assert not listener.accepted

:class:`~openenv.testing.git_server.LocalGitServer` stands in for the Gitea server that
:class:`~openenv.core.tools.git_server_client.GitServerClient` clones from.
"""

from .escape import (
    HostListener,
    PlantedSecret,
    host_listener,
    planted_secret,
    processes_added,
    processes_per_uid,
    wait_for,
)
from .git_server import LocalGitServer

__all__ = [
    "HostListener",
    "LocalGitServer",
    "PlantedSecret",
    "host_listener",
    "planted_secret",
    "processes_added",
    "processes_per_uid",
    "wait_for",
]

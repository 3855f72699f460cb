"""The classic-control environments of Gymnasium, one per session."""

from __future__ import annotations

from openenv.gymnasium import CLASSIC_CONTROL, GymnasiumEnvironment


class ClassicControlEnvironment(GymnasiumEnvironment):
    """``GymnasiumEnvironment`` limited to the classic-control ids (``CartPole-v1`` by default).

    A classic-control step is a few NumPy operations (microseconds, never blocking), so the
    server calls it on its event loop rather than in its worker pool. The server's
    ``OPENENV_GYMNASIUM_ENV_IDS`` and ``OPENENV_GYMNASIUM_MAKE_KWARGS`` replace the allowed ids
    and ``gymnasium.make`` keywords (e.g. for Gymnasium's toy-text environments, as cheap).
    """

    RUNS_ON_EVENT_LOOP = True
    ENV_IDS = CLASSIC_CONTROL

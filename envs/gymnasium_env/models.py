"""What an agent sends and sees: OpenEnv's Gymnasium models (:mod:`openenv.gymnasium.models`).

``GymnasiumAction(action=...)`` carries one action in JSON form (an int for CartPole's
``Discrete(2)``, a list of floats for Pendulum's ``Box``); ``GymnasiumObservation`` carries
``observation``, ``terminated``, ``truncated`` and ``info``, and after a reset the ``env_id``
and both spaces described as JSON.
"""

from openenv.gymnasium.models import GymnasiumAction, GymnasiumObservation, GymnasiumState

__all__ = ["GymnasiumAction", "GymnasiumObservation", "GymnasiumState"]

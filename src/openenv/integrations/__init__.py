"""Bridges between OpenEnv environments and training libraries.

Each submodule imports its library only when used: ``openenv.integrations.trl`` for TRL's
``GRPOTrainer``.
"""

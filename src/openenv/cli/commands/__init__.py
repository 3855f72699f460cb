"""One module per ``openenv`` command; each has ``register(app)``."""

"""The ``openenv`` command line: scaffold, serve, validate, build, publish and list environments."""

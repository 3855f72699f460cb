"""Where environment servers run: providers that start them (see :mod:`.runtime`)."""

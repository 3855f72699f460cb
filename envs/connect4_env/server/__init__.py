"""Server side of the Connect Four environment."""

"""Server side of the shell environment."""

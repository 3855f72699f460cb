"""Server side of the git environment."""

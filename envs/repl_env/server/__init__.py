"""Server side of the REPL environment."""

"""User tools: profiling, debugging observers, the command line."""

"""Running plans: the executor, compiled graphs and subgraphs."""

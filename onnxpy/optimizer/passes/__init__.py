"""Optimizer passes, one per file. Each is ``run(graph) -> bool`` (True when it changed the graph)."""

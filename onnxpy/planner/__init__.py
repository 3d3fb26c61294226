"""Execution planning: turn a graph with bound kernels into an ExecutionPlan (plain data)."""

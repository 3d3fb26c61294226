"""The graph representation every stage after loading works on."""

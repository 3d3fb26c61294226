"""Graph optimizer: passes that rewrite a Graph without changing what it computes."""

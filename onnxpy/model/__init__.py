"""Model loading and the element-type table."""

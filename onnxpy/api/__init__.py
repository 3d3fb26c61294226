"""The onnxruntime-compatible API layer: thin, validates, delegates to runtime/."""

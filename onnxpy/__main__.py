"""``python -m onnxpy`` is the ``onnxpy`` command."""

import sys

from .cli import main

sys.exit(main())

"""Row-split execution: a plan's spatial steps run as two halves of output rows, one in this
process and one in a forked helper process, over shared memory (see ``runner.py``)."""

"""The host side of tracing: ``ctx.tracing`` (``core``), which gives kernels their trace
buffers and collects, merges and exports what they recorded (through :mod:`iris_trace`)."""

"""Collectives written in Gluon, for upstream Iris's ``Config(use_gluon=True)``.

Each kernel keeps its Triton twin's protocol (the same ready and done handshakes, from
:mod:`iris.ccl.device`) and spells out its tiles' layouts, as Gluon asks. The host side
(:mod:`iris.ccl.all_gather`, :mod:`iris.ccl.all_to_all`) picks them for the direct
protocol on GPUs; small calls keep their low-latency and staged Triton kernels, and under
the emulation backend, whose interpreter runs no Gluon, the Triton kernels run.
"""

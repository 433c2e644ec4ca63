"""The host runtime: what runs in each rank's Python process, beside the kernels.

``iris.host.iris`` is the context (``iris.iris(heap_size)``) and owns the parts below;
``memory`` holds the symmetric heap and its tensor factories, ``distributed`` the ranks'
coordination and topology, ``tracing`` the host side of tracing; the flight recorder,
hang reports, copy engine, prepared launches and logging are modules of their own.
The device code these launch lives in :mod:`iris.device`; docs/layout.md draws the layers.
"""

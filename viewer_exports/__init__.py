"""Writers that turn merged Iris traces into Perfetto protobuf and Chrome JSON.

Filled by the ``exports:`` issue; nothing here yet.
"""

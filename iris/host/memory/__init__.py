"""The symmetric heap (``heap``) and the tensor factories that allocate on it (``tensors``)."""

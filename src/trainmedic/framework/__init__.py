"""Facts about the deep-learning framework installed (PyTorch)."""

"""raystream: learning from streaming video with orthogonal gradients, on Ray Train, Ray Tune and MLflow."""

__version__ = "0.1.0"

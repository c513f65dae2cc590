"""tfcluster: one-off, cloud-agnostic distributed TensorFlow training clusters (make up train down)."""

__version__ = "0.1.0"

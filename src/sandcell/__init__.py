"""sandcell: a trusted job service in front of untrusted gVisor sandboxes."""

__version__ = "0.1.0"

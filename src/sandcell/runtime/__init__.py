"""Adapters that run sandboxes on this host: gVisor (runsc) and the images it boots."""

"""Command line faces: the server, the worker, and a client for people."""

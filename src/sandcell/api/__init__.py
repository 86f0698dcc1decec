"""The HTTP face of sandcell: a thin FastAPI layer over the services."""

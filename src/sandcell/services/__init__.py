"""The behaviour of sandcell, over ports only."""

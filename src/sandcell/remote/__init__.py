"""Adapters that reach other sandcell processes over HTTP."""

"""`sandcell acceptance`: the five-step acceptance test of DESIGN.md section 9.

It talks to a running deployment over HTTP only, as any client would, with its own tenants,
synthetic inputs and loopback endpoints, and removes what it made when it ends.
"""

from sandcell.acceptance.runner import STEPS, Options, run_acceptance

__all__ = ["STEPS", "Options", "run_acceptance"]

"""Identifiers: a short type prefix and 128 random bits, unguessable across tenants."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"

"""Encryption of secret values at rest."""

"""Blob storage adapters."""

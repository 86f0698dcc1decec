"""Store adapters: one SQL implementation over SQLite (default) and PostgreSQL."""

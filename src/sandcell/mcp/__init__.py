"""`sandcell mcp`: an MCP server that is a thin face over a sandcell deployment's HTTP API."""

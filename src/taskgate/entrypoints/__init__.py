"""User-facing entrypoints: the CLI (and, later, the MCP server)."""

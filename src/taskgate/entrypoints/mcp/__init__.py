"""The MCP server: every taskgate operation as a tool, over stdio and authenticated streamable HTTP."""

"""The operator console in the browser: board, session pages, diff review, audit (served beside /mcp)."""

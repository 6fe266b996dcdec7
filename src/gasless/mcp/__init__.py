"""The MCP server for agents: tools and resources over the service's own HTTP routes, mounted at `/mcp` on
every API host (streamable HTTP) and run over stdio by `gasless mcp`."""

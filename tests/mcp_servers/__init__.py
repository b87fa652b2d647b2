"""Real MCP servers the tests start, written with the SDK's ``MCPServer``."""

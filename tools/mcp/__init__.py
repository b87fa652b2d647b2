"""Tools from Model Context Protocol servers.

A deployment names a server in a toolset class (``McpToolset``) and
declares each tool's effect there, in code, as for a builtin tool (G1). The
server's own annotations are hints: shown beside the declaration, flagged
when they contradict it, never acted on.
"""

from tools.mcp.declaration import Declared, McpToolset, Stdio, StreamableHttp, Undeclared

__all__ = ["Declared", "McpToolset", "Stdio", "StreamableHttp", "Undeclared"]

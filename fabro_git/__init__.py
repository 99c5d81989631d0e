"""git fabro: AI-agent workflows as DOT graphs, with the git repository as the only store."""

__version__ = "0.1.0"

"""git fabro: AI-agent workflows as DOT graphs, with the git repository as the only store."""

__version__ = "0.1.0"

# Set by the `git-fabro` console script (`fabro_git.cli.entry`): this process is the
# command itself, not a library user or a test, so it may act as one, e.g. become the
# subreaper its stages' orphans are re-parented to (`fabro_git.engine.reaper`).
running_as_command = False

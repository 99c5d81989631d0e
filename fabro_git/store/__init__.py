"""The git-native store: the only package that touches git objects and refs.

Everything a run makes durable lives in the repository: the run branch
(`refs/heads/fabro/run/<id>`), the metadata history (`refs/fabro/meta/<id>`) and
parallel branches (`refs/fabro/parallel/<id>/…`). The rest of the tool speaks in run ids,
snapshots and worktrees; dulwich and the git CLI stay behind these modules:

- `repo`: discovery, HEAD, compare-and-swap ref moves, reading and writing objects
- `blobs`: a blob's size from its header, and how much of a run's file is read whole
- `snapshot`: metadata snapshots that rebuild only the trees that changed
- `worktree`: run worktrees and turning them into tree objects
- `runs`: run ids (ULIDs), ref names, listing and prefix resolution
- `remote`: ls-remote, fetch and push of run refs

Nothing is imported here, so importing the package costs nothing; import the module
you need.
"""

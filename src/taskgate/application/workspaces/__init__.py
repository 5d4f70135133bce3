"""Each session's git worktree and branch (the git effects of transitions, review, reconciliation) and the project
context scout."""
